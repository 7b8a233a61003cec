package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Short YAML tags as yaml.v3 reports them from Node.ShortTag.
const (
	tagStr   = "!!str"
	tagNull  = "!!null"
	tagMerge = "!!merge"
)

// Load reads the YAML file at path and returns its configuration, expanded,
// provisioned and validated. The returned Config's Path is path, so that a
// relative store path is resolved beside the file.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return parse(data, path, path, os.LookupEnv)
}

// Parse returns the configuration in data, expanded, provisioned and
// validated. Name only labels error messages (it is usually a file name);
// the returned Config's Path stays empty, so a relative store path is
// relative to the working directory.
//
// Parsing is strict: a key the Config types do not know is an error, as is
// a value of the wrong type, an unset environment variable, an empty
// document or more than one document. Every problem found is returned,
// joined with errors.Join, each a *FieldError naming its line and path when
// they are known.
//
// Scalar values (never keys) may refer to the environment: "${VAR}" is
// VAR's value, and an error when VAR is unset; "${VAR:-default}" is
// default when VAR is unset or empty, as in the shell; "$$" is a literal
// "$". A "$" followed by anything else is kept as it is. An unquoted value
// is typed after expansion, so "weight: ${W:-2}" is the integer 2. Inside
// a flow mapping or list ("{...}", "[...]") YAML reads "{" and "}" as
// delimiters, so a value holding "${...}" there must be quoted.
func Parse(data []byte, name string) (*Config, error) {
	return parse(data, name, "", os.LookupEnv)
}

// parse is Parse with the config's path and the environment as arguments,
// so that tests need not touch the process environment.
func parse(data []byte, name, path string, lookupEnv func(string) (string, bool)) (*Config, error) {
	root, err := parseDocument(data)
	if err != nil {
		return nil, attribute(name, []error{err}, nil)
	}
	// Every problem of the file is reported in one pass: what the
	// expansion and the walk refuse is pruned from the tree, the rest is
	// decoded, provisioned and validated, and Validate's findings join
	// theirs, less those about a part already reported.
	w := walker{lines: make(map[string]int), visited: make(map[visit]bool), bad: make(map[*yaml.Node]bool)}
	w.errs = expandTree(root, "", lookupEnv, w.markBad)
	w.walk(root, reflect.TypeFor[Config](), "")
	if len(w.errs) > 0 {
		prune(root, w.bad, make(map[*yaml.Node]bool))
	}
	// The walk has checked every key and every scalar against the types
	// and the prune removed what failed, so Decode failing here means the
	// walk missed a case; yaml.v3's own message still carries the line.
	var cfg Config
	if err := root.Decode(&cfg); err != nil {
		return nil, attribute(name, append(w.errs, fmt.Errorf("decode: %w", err)), nil)
	}
	cfg.Path = path
	cfg.Provision()
	errs := w.errs
	if err := cfg.Validate(); err != nil {
		for _, e := range splitJoined(err) {
			var fe *FieldError
			if errors.As(e, &fe) && w.covered(fe.Path) {
				continue
			}
			errs = append(errs, e)
		}
	}
	if len(errs) > 0 {
		return nil, attribute(name, sortByLine(errs, w.lines), w.lines)
	}
	return &cfg, nil
}

// parseDocument parses data into a yaml.Node tree and returns its root
// mapping (or whatever else the single document holds).
func parseDocument(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			// Nothing but whitespace and comments.
			return nil, errors.New("empty configuration")
		}
		return nil, err
	}
	// A second document would be silently ignored by Decode; refuse it
	// rather than run with half of what the user wrote.
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, err
	default:
		return nil, fieldErrorf(extra.Line, "", "more than one YAML document; want one")
	}
	root := &doc
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		root = doc.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.ShortTag() == tagNull {
		// "---" alone, or "~".
		return nil, errors.New("empty configuration")
	}
	return root, nil
}

// expandTree expands environment references in the value of every scalar
// in the tree at n, and returns one error per value that could not be
// expanded, each such value also passed to markBad. Mapping keys are never expanded: the walk must see the keys
// the user wrote. Aliases are skipped because the anchored node they share
// is expanded where it is defined; expanding it twice would turn "$$$$"
// into "$" instead of "$$".
func expandTree(n *yaml.Node, path string, lookupEnv func(string) (string, bool), markBad func(*yaml.Node, string)) []error {
	var errs []error
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			errs = append(errs, expandTree(c, path, lookupEnv, markBad)...)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			errs = append(errs, expandTree(c, indexPath(path, i), lookupEnv, markBad)...)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			errs = append(errs, expandTree(n.Content[i+1], childPath(path, keyLabel(n.Content[i])), lookupEnv, markBad)...)
		}
	case yaml.ScalarNode:
		if !strings.Contains(n.Value, "$") {
			return nil
		}
		v, err := expand(n.Value, lookupEnv)
		if err != nil {
			markBad(n, path)
			return []error{&FieldError{Line: n.Line, Path: path, Err: err}}
		}
		n.Value = v
		if n.Style == 0 {
			// An unquoted, untagged scalar was typed by the parser from
			// the text before expansion ("${W}" is a string). Clearing the
			// tag has yaml.v3 type it again from the expanded text, as if
			// the user had written the value itself; the walk pins it back
			// to a string where the field is a string.
			n.Tag = ""
		}
	}
	return errs
}

// keyLabel is how a mapping key appears in a path.
func keyLabel(k *yaml.Node) string {
	if k.Kind == yaml.ScalarNode {
		return k.Value
	}
	return "?"
}

// expand replaces "${VAR}", "${VAR:-default}" and "$$" in s. The default
// is taken literally, up to the first "}".
func expand(s string, lookupEnv func(string) (string, bool)) (string, error) {
	var b strings.Builder
	for {
		i := strings.IndexByte(s, '$')
		if i < 0 || i == len(s)-1 {
			b.WriteString(s)
			return b.String(), nil
		}
		b.WriteString(s[:i])
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			s = s[i+2:]
			continue
		case '{':
		default:
			// A lone "$" is kept, so that secrets such as "pa$word" need
			// no escaping.
			b.WriteByte('$')
			s = s[i+1:]
			continue
		}
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return "", fmt.Errorf("unterminated %q: want ${VAR} or ${VAR:-default}", s[i:])
		}
		ref := s[i : i+end+1]
		inner := ref[2 : len(ref)-1]
		name, def, hasDefault := strings.Cut(inner, ":-")
		if !validEnvName(name) {
			return "", fmt.Errorf("unsupported reference %q: want ${VAR} or ${VAR:-default}, where VAR is letters, digits and _", ref)
		}
		val, ok := lookupEnv(name)
		switch {
		case hasDefault && val == "":
			val = def
		case !ok:
			return "", fmt.Errorf("environment variable %s is not set (write ${%s:-} to allow it to be unset)", name, name)
		}
		b.WriteString(val)
		s = s[i+end+1:]
	}
}

// validEnvName reports whether s is a shell variable name.
func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// prune takes the nodes marked bad out of the tree at n: a mapping pair
// whose key or value is bad is dropped, and a bad list item becomes null,
// so that the indexes of the items after it, which errors name, stay as
// written. seen stops it at nodes shared through aliases.
func prune(n *yaml.Node, bad, seen map[*yaml.Node]bool) {
	if seen[n] {
		return
	}
	seen[n] = true
	switch n.Kind {
	case yaml.DocumentNode, yaml.AliasNode:
		for _, c := range n.Content {
			prune(c, bad, seen)
		}
		if n.Alias != nil {
			prune(n.Alias, bad, seen)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			if bad[c] {
				n.Content[i] = &yaml.Node{Kind: yaml.ScalarNode, Tag: tagNull, Line: c.Line, Column: c.Column}
				continue
			}
			prune(c, bad, seen)
		}
	case yaml.MappingNode:
		kept := n.Content[:0]
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if bad[k] || bad[v] {
				continue
			}
			prune(v, bad, seen)
			kept = append(kept, k, v)
		}
		n.Content = kept
	}
}

// sortByLine orders errors as they appear in the file, those without a
// line of their own by their enclosing path's line, and keeps the order of
// equals, so that a user reads them top to bottom.
func sortByLine(errs []error, lines map[string]int) []error {
	line := func(err error) int {
		var fe *FieldError
		if !errors.As(err, &fe) {
			return 0
		}
		if fe.Line > 0 {
			return fe.Line
		}
		for p := fe.Path; p != ""; p = parentPath(p) {
			if l := lines[p]; l > 0 {
				return l
			}
		}
		return 0
	}
	slices.SortStableFunc(errs, func(a, b error) int { return line(a) - line(b) })
	return errs
}

// visit is a node checked against a type; see walker.visited.
type visit struct {
	node *yaml.Node
	typ  reflect.Type
}

// walker checks a yaml.Node tree against the Go types it will be decoded
// into. yaml.v3 only offers KnownFields on a Decoder, which would mean
// re-encoding the expanded tree and losing its line numbers, so the walk
// does the checking itself. It also checks each scalar's type, to name the
// field's path in the error instead of only yaml.v3's Go type.
type walker struct {
	errs []error
	// lines maps each path present in the file to its line, so that
	// Validate's errors can point into the file.
	lines map[string]int
	// visited holds the mappings and lists already checked, so that a
	// document full of aliases to aliases ("billion laughs") costs no more
	// than its size.
	visited map[visit]bool
	// bad holds the nodes refused, which prune takes out of the tree, and
	// badPaths where they are, so that Validate's complaints about what
	// was pruned (a missing name, a zero value) are not reported twice.
	bad      map[*yaml.Node]bool
	badPaths []string
}

// markBad records node n at path as refused.
func (w *walker) markBad(n *yaml.Node, path string) {
	w.bad[n] = true
	w.badPaths = append(w.badPaths, path)
}

// covered reports whether path is at or below a refused node.
func (w *walker) covered(path string) bool {
	for _, b := range w.badPaths {
		if path == b || strings.HasPrefix(path, b) && (b == "" || path[len(b)] == '.' || path[len(b)] == '[') {
			return true
		}
	}
	return false
}

// firstVisit reports whether collection node n has not been checked
// against t yet, and marks it checked. An anchored node is checked where
// it is defined, so a problem in it is reported once, at its own line,
// not again at every alias.
func (w *walker) firstVisit(n *yaml.Node, t reflect.Type) bool {
	if n.Kind != yaml.MappingNode && n.Kind != yaml.SequenceNode {
		return true
	}
	v := visit{n, t}
	if w.visited[v] {
		return false
	}
	w.visited[v] = true
	return true
}

// fail records a problem with node n at path, and marks n refused.
func (w *walker) fail(n *yaml.Node, path, format string, args ...any) {
	w.failAt(n, path, path, format, args...)
}

// failAt is fail for a problem reported at path about a node that sits at
// nodePath: a key is reported at its mapping's path but stands for the
// field it names.
func (w *walker) failAt(n *yaml.Node, path, nodePath, format string, args ...any) {
	w.errs = append(w.errs, fieldErrorf(n.Line, path, format, args...))
	w.markBad(n, nodePath)
}

// walk checks n against t; path is where n is.
func (w *walker) walk(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			w.fail(n, path, "alias to nothing")
			return
		}
		n = n.Alias
	}
	if w.bad[n] || !w.firstVisit(n, t) {
		// A value the expansion refused has been reported already.
		return
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "" && t.Kind() == reflect.String {
		// An expanded value meant as a string stays one, even if it
		// reads as null, a number or a boolean.
		n.Tag = tagStr
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == tagNull {
		// Null (an empty value, "~") decodes to the zero value of any
		// type, which Provision then fills in.
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		w.walkStruct(n, t, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			w.fail(n, path, "want a list, got %s", describeNode(n))
			return
		}
		for i, c := range n.Content {
			p := indexPath(path, i)
			w.lines[p] = c.Line
			w.walk(c, t.Elem(), p)
		}
	case reflect.Map:
		// A map of strings (telemetry.headers): any keys, each value
		// checked as the map's element type.
		if n.Kind != yaml.MappingNode {
			w.fail(n, path, "want a mapping, got %s", describeNode(n))
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			w.walkScalar(k, t.Key(), path)
			p := path + "." + k.Value
			w.lines[p] = v.Line
			w.walk(v, t.Elem(), p)
		}
	default:
		w.walkScalar(n, t, path)
	}
}

// walkStruct checks that n is a mapping whose keys are all fields of t.
func (w *walker) walkStruct(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind != yaml.MappingNode {
		w.fail(n, path, "want a mapping, got %s", describeNode(n))
		return
	}
	fields := yamlFields(t)
	w.walkPairs(n, t, fields, path, make(map[string]int))
}

// walkPairs checks the key-value pairs of mapping n against fields, and
// follows merge keys ("<<: *base") into the mappings they merge. seen holds
// the line of each key written directly in n, to refuse duplicates; it is
// nil for merged mappings, whose keys the direct ones may override.
func (w *walker) walkPairs(n *yaml.Node, t reflect.Type, fields map[string]reflect.Type, path string, seen map[string]int) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			w.failAt(k, path, childPath(path, "?"), "want a plain key, got %s", describeNode(k))
			continue
		}
		if k.ShortTag() == tagMerge {
			w.walkMerge(v, t, fields, path)
			continue
		}
		if seen != nil {
			if first, dup := seen[k.Value]; dup {
				// The first occurrence stands; the duplicate is pruned.
				w.failAt(k, path, childPath(path, k.Value)+"#dup", "duplicate key %q (first at line %d)", k.Value, first)
				continue
			}
			seen[k.Value] = k.Line
		}
		ft, ok := fields[k.Value]
		if !ok {
			w.failAt(k, path, childPath(path, k.Value), "unknown key %q%s", k.Value, suggest(k.Value, fields))
			continue
		}
		// A field's line is its key's: for a block mapping the value
		// starts on the next line.
		p := childPath(path, k.Value)
		w.lines[p] = k.Line
		w.walk(v, ft, p)
	}
}

// walkMerge checks the value of a merge key: a mapping, or a list of
// mappings, usually given as aliases.
func (w *walker) walkMerge(v *yaml.Node, t reflect.Type, fields map[string]reflect.Type, path string) {
	if v.Kind == yaml.AliasNode && v.Alias != nil {
		v = v.Alias
	}
	if !w.firstVisit(v, t) {
		return
	}
	switch v.Kind {
	case yaml.MappingNode:
		w.walkPairs(v, t, fields, path, nil)
	case yaml.SequenceNode:
		for _, c := range v.Content {
			if c.Kind == yaml.SequenceNode {
				// yaml.v3 refuses nested lists in a merge too.
				w.fail(c, path, "want a mapping to merge, got %s", describeNode(c))
				continue
			}
			w.walkMerge(c, t, fields, path)
		}
	default:
		w.fail(v, path, "want a mapping to merge, got %s", describeNode(v))
	}
}

// walkScalar checks that n is a scalar that decodes into a t.
func (w *walker) walkScalar(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind != yaml.ScalarNode {
		w.fail(n, path, "want a single value, got %s", describeNode(n))
		return
	}
	if err := n.Decode(reflect.New(t).Interface()); err == nil && !truncated(n, t) {
		return
	}
	switch {
	case t == reflect.TypeFor[time.Duration]():
		w.fail(n, path, "want a duration such as \"5s\" or \"250ms\", got %q", n.Value)
	case t.Kind() == reflect.Bool:
		w.fail(n, path, "want true or false, got %q", n.Value)
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		w.fail(n, path, "want an integer, got %q", n.Value)
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		w.fail(n, path, "want a number, got %q", n.Value)
	default:
		w.fail(n, path, "cannot use %q as %s", n.Value, t)
	}
}

// truncated reports whether decoding n into integer type t drops a
// fraction: yaml.v3 decodes "1.5" into an int as 1, without an error.
func truncated(n *yaml.Node, t reflect.Type) bool {
	if t.Kind() < reflect.Int || t.Kind() > reflect.Uint64 || n.ShortTag() != "!!float" {
		return false
	}
	var f float64
	return n.Decode(&f) != nil || f != math.Trunc(f)
}

// describeNode names what a node is, for "want X, got Y" messages.
func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	case yaml.AliasNode:
		return "an alias"
	default:
		return "a document"
	}
}

// yamlFields maps the YAML keys of struct type t to their field types, the
// way yaml.v3 names them: the tag's name, else the lower-cased field name;
// "-" and unexported fields are skipped and ",inline" structs flattened.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	fields := make(map[string]reflect.Type, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if strings.Contains(","+opts+",", ",inline,") && f.Type.Kind() == reflect.Struct {
			for k, v := range yamlFields(f.Type) {
				fields[k] = v
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fields[name] = f.Type
	}
	return fields
}

// suggest returns ` (did you mean "x"?)` for the known key closest to an
// unknown one, when it is close enough to be a likely typo.
func suggest(key string, fields map[string]reflect.Type) string {
	best, bestDist := "", 3
	for name := range fields {
		d := editDistance(key, name)
		if d < bestDist || d == bestDist && name < best {
			best, bestDist = name, d
		}
	}
	if best == "" || bestDist > len(key)/2 {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
