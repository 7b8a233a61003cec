package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// FieldError is one problem with one part of a configuration. Load, Parse
// and Validate return every problem they find as FieldErrors joined with
// errors.Join, so that a user fixes a file in one pass rather than one error
// per run. Use errors.As to get at the first one, or unwrap the join to list
// them all.
type FieldError struct {
	// File is the name given to Parse, or the path given to Load. Validate
	// leaves it empty: a Config holds no file name of its own.
	File string
	// Line is the 1-based line of the offending YAML. It is 0 when unknown:
	// Validate alone sees no YAML, and a missing field has no line.
	Line int
	// Path names the field the way a user would find it in the file, such
	// as "models[2].backends[0]"; it is empty for the document as a whole.
	Path string
	// Err says what is wrong.
	Err error
}

// Error formats the error as "file: line N: path: problem", leaving out
// whichever of the first three parts is unknown.
func (e *FieldError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(": ")
	}
	if e.Line > 0 {
		b.WriteString("line ")
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(": ")
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the underlying problem.
func (e *FieldError) Unwrap() error { return e.Err }

// fieldErrorf builds a FieldError whose problem is a formatted message.
func fieldErrorf(line int, path, format string, args ...any) *FieldError {
	return &FieldError{Line: line, Path: path, Err: fmt.Errorf(format, args...)}
}

// splitJoined returns the errors inside an errors.Join, or err alone.
func splitJoined(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// attribute stamps file on every FieldError in errs and, where a
// FieldError has no line, takes it from lines (by its path, or failing that
// by the nearest enclosing path that has one), so that problems Validate
// finds in the decoded Config still point into the file. Errors that are
// not FieldErrors are prefixed with file.
func attribute(file string, errs []error, lines map[string]int) error {
	out := make([]error, 0, len(errs))
	for _, err := range errs {
		var fe *FieldError
		if !errors.As(err, &fe) {
			if file != "" {
				err = fmt.Errorf("%s: %w", file, err)
			}
			out = append(out, err)
			continue
		}
		fe.File = file
		for p := fe.Path; fe.Line == 0 && p != ""; p = parentPath(p) {
			fe.Line = lines[p]
		}
		out = append(out, fe)
	}
	return errors.Join(out...)
}

// parentPath strips the last element from a path: "models[0].backends[1]"
// becomes "models[0].backends", then "models[0]", then "models", then "".
func parentPath(p string) string {
	i := strings.LastIndexAny(p, ".[")
	if i < 0 {
		return ""
	}
	return p[:i]
}

// childPath appends a mapping key to a path.
func childPath(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

// indexPath appends a sequence index to a path.
func indexPath(parent string, i int) string {
	return parent + "[" + strconv.Itoa(i) + "]"
}
