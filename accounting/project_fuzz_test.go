package accounting

import (
	"bytes"
	"errors"
	"regexp"
	"strings"
	"testing"
)

// projectPart is what each part of an accepted Compat-Project header, or a
// default standing in for it, must look like.
var projectPart = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// FuzzParseProject checks, on arbitrary header values, that ParseProject
// never panics; that a refusal is a *ProjectError whose message is one of
// the fixed messages (so it never echoes the header back); and that an
// accepted header yields a team and a project of 1 to 128 name characters,
// taken from the header where it names them, that format back into a
// header parsing to the same pair.
func FuzzParseProject(f *testing.F) {
	long := strings.Repeat("a", 128)
	seeds := []string{
		"", " ", "\t", "acme/chatbot", "acme", "acme/", "/chatbot", "/", " acme/chatbot\t",
		"A-z_0.9/b.C_d-9", long + "/" + long, long + "a/x", "x/" + long + "a",
		"acme/chat/bot", "//", "ac me/x", "acme / chatbot", "ac:me/x", `acme\chatbot`,
		"acme/\x00", "caf\xc3\xa9/x", "\xff/\xfe", "acme\r\n/x", "..", "-/_",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	// The refusals, each produced by a header of its kind; every refusal
	// must be one of these, whatever the header.
	messages := map[string]bool{}
	for _, bad := range []string{"a/b/c", long + "a", "a/" + long + "a", "a b", "a/b c"} {
		_, _, err := ParseProject([]byte(bad), "d", "p")
		if err == nil {
			f.Fatalf("ParseProject(%q) accepted a malformed header", bad)
		}
		messages[err.Error()] = true
	}
	const defTeam, defProject = "default-team", "inference"
	f.Fuzz(func(t *testing.T, header []byte) {
		orig := bytes.Clone(header)
		team, project, err := ParseProject(header, defTeam, defProject)
		if !bytes.Equal(header, orig) {
			t.Fatalf("ParseProject modified its input")
		}
		if err != nil {
			var pe *ProjectError
			if !errors.As(err, &pe) || pe.Message == "" {
				t.Fatalf("error %v (%T) is not a *ProjectError with a message", err, err)
			}
			if !messages[pe.Message] {
				t.Fatalf("refusal of %q has an unexpected message %q", header, pe.Message)
			}
			if team != "" || project != "" {
				t.Fatalf("refusal of %q also returned %q/%q", header, team, project)
			}
			return
		}
		if !projectPart.MatchString(team) || !projectPart.MatchString(project) {
			t.Fatalf("accepted %q as team %q project %q", header, team, project)
		}
		// A part the header names is what it names; a part it leaves out
		// is the default.
		namedTeam, namedProject, _ := strings.Cut(string(bytes.Trim(header, " \t")), "/")
		wantTeam, wantProject := namedTeam, namedProject
		if wantTeam == "" {
			wantTeam = defTeam
		}
		if wantProject == "" {
			wantProject = defProject
		}
		if team != wantTeam || project != wantProject {
			t.Fatalf("header %q parsed as %q/%q, want %q/%q", header, team, project, wantTeam, wantProject)
		}
		// Formatting the pair back gives a header that parses to it, with
		// any defaults.
		t2, p2, err := ParseProject([]byte(team+"/"+project), "other", "other")
		if err != nil || t2 != team || p2 != project {
			t.Fatalf("%q re-formatted as %q parses to %q/%q, %v", header, team+"/"+project, t2, p2, err)
		}
	})
}
