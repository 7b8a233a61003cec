package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"gopkg.in/yaml.v3"
)

// docYAML is a fenced YAML block of the README or of a page of docs/,
// with the file and the heading it stands under.
type docYAML struct {
	file, heading, body string
}

var (
	docFence   = regexp.MustCompile("(?ms)^```yaml\n(.*?)^```")
	docHeading = regexp.MustCompile(`(?m)^#{1,3} (.+)$`)
)

// The configuration reference: the YAML block under this heading of this
// page, which every other block is laid over.
const (
	referencePage    = "docs/configuration.md"
	referenceHeading = "Every field"
)

// docPages returns the README and every page of docs/, as paths from the
// repository's root, the README first.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, p := range pages {
		out = append(out, strings.TrimPrefix(filepath.ToSlash(p), "../../"))
	}
	return out
}

// docYAMLBlocks returns every ```yaml block of the README and of docs/, in
// page order and in order within a page.
func docYAMLBlocks(t *testing.T) []docYAML {
	t.Helper()
	var blocks []docYAML
	for _, page := range docPages(t) {
		text, err := os.ReadFile("../../" + page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range docFence.FindAllSubmatchIndex(text, -1) {
			heading := "(no heading)"
			for _, h := range docHeading.FindAllSubmatch(text[:m[0]], -1) {
				heading = string(h[1])
			}
			blocks = append(blocks, docYAML{file: page, heading: heading, body: string(text[m[2]:m[3]])})
		}
	}
	return blocks
}

// TestReadmeConfigsLoad checks every configuration the README and the
// pages of docs/ show with the real loader, as `tollgate -check-config`
// does, so that the documentation cannot drift from the code: the
// configuration reference as it stands, each fragment (such as the replica
// set-up) laid over the reference, and the example configuration the
// README's commands run on.
func TestReadmeConfigsLoad(t *testing.T) {
	// The variables the examples name; the loader expands them.
	for name, value := range map[string]string{
		"TOLLGATE_DEV_KEY":    "sk-readme-example-key-0123456789",
		"VLLM_KEY":            "upstream-key",
		"TOLLGATE_PG_DSN":     "postgres://tollgate@db.internal:5432/tollgate",
		"TOLLGATE_REDIS_ADDR": "redis.internal:6379",
		"TOLLGATE_CONFIG":     "",
	} {
		t.Setenv(name, value)
	}
	blocks := docYAMLBlocks(t)
	var reference string
	for _, b := range blocks {
		if b.file == referencePage && b.heading == referenceHeading {
			reference = b.body
		}
	}
	if reference == "" {
		t.Fatalf("%s has no ```yaml block under %q", referencePage, referenceHeading)
	}
	dir := t.TempDir()
	check := func(t *testing.T, name, body string) {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		if err := run([]string{"-check-config", path}, &out, &errOut); err != nil {
			t.Fatalf("the documented configuration fails the loader:\n%v\n%s", err, body)
		}
		if !strings.Contains(out.String(), "configuration is valid") {
			t.Fatalf("-check-config said %q", out.String())
		}
	}
	t.Run("reference", func(t *testing.T) { check(t, "reference.yaml", reference) })
	fragments := 0
	for _, b := range blocks {
		if b.body == reference {
			continue
		}
		fragments++
		t.Run("fragment in "+b.file+" under "+b.heading, func(t *testing.T) {
			check(t, "fragment.yaml", overlay(t, reference, b.body))
		})
	}
	if fragments == 0 {
		t.Error("no YAML fragment beside the reference was found: the pages were not read")
	}
	t.Run("config.example.yaml", func(t *testing.T) {
		body, err := os.ReadFile("../../config.example.yaml")
		if err != nil {
			t.Fatal(err)
		}
		check(t, "config.example.yaml", string(body))
	})
}

// docLink is a Markdown link: [text](target).
var docLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestReadmeLinksResolve checks every relative link of the README and of
// docs/: the file it names exists, and the heading its #anchor names is
// on that page, so that the map of the docs follows the pages as they move.
func TestReadmeLinksResolve(t *testing.T) {
	checked := 0
	for _, page := range docPages(t) {
		text, err := os.ReadFile("../../" + page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range docLink.FindAllSubmatch(text, -1) {
			target := string(m[1])
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			linked := page
			if file != "" {
				linked = filepath.ToSlash(filepath.Join(filepath.Dir(page), file))
			}
			checked++
			body, err := os.ReadFile("../../" + linked)
			if err != nil {
				t.Errorf("%s links to %s, which does not exist", page, target)
				continue
			}
			if anchor != "" && !hasAnchor(body, anchor) {
				t.Errorf("%s links to %s, but %s has no heading with that anchor", page, target, linked)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d links; the pages were not read", checked)
	}
}

// hasAnchor reports whether a heading of the Markdown page text has the
// anchor GitHub gives it: lower case, spaces as hyphens, other punctuation
// dropped.
func hasAnchor(text []byte, anchor string) bool {
	for _, h := range docHeading.FindAllSubmatch(text, -1) {
		var slug strings.Builder
		for _, r := range strings.ToLower(string(h[1])) {
			switch {
			case r == ' ':
				slug.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				slug.WriteRune(r)
			}
		}
		if slug.String() == anchor {
			return true
		}
	}
	return false
}

// TestReadmeSizes keeps the README a page a newcomer reads in one sitting
// and BENCHMARKS.md the current figures only: what grows goes to docs/,
// and the history of measurements stays in git.
func TestReadmeSizes(t *testing.T) {
	for _, c := range []struct {
		file     string
		maxLines int
	}{
		{"README.md", 200},
		{"BENCHMARKS.md", 300},
	} {
		t.Run(c.file, func(t *testing.T) {
			text, err := os.ReadFile("../../" + c.file)
			if err != nil {
				t.Fatal(err)
			}
			if n := bytes.Count(text, []byte("\n")); n > c.maxLines {
				t.Errorf("%s has %d lines, over %d: move the detail to docs/", c.file, n, c.maxLines)
			}
		})
	}
}

// overlay replaces the reference's top-level sections with the fragment's,
// as a reader applies a README snippet to a working file.
func overlay(t *testing.T, reference, fragment string) string {
	t.Helper()
	var base, part yaml.Node
	if err := yaml.Unmarshal([]byte(reference), &base); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(fragment), &part); err != nil {
		t.Fatalf("a documented YAML block does not parse: %v\n%s", err, fragment)
	}
	baseMap, partMap := base.Content[0], part.Content[0]
	for i := 0; i < len(partMap.Content); i += 2 {
		key, value := partMap.Content[i], partMap.Content[i+1]
		replaced := false
		for j := 0; j < len(baseMap.Content); j += 2 {
			if baseMap.Content[j].Value == key.Value {
				baseMap.Content[j+1] = value
				replaced = true
			}
		}
		if !replaced {
			baseMap.Content = append(baseMap.Content, key, value)
		}
	}
	out, err := yaml.Marshal(&base)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
