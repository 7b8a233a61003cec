package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// readmeYAML is a fenced YAML block of the README with the heading it
// stands under.
type readmeYAML struct {
	heading string
	body    string
}

var (
	readmeFence   = regexp.MustCompile("(?ms)^```yaml\n(.*?)^```")
	readmeHeading = regexp.MustCompile(`(?m)^#{2,3} (.+)$`)
)

// readmeYAMLBlocks returns every ```yaml block of README.md in order.
func readmeYAMLBlocks(t *testing.T) []readmeYAML {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []readmeYAML
	for _, m := range readmeFence.FindAllSubmatchIndex(readme, -1) {
		heading := "(no heading)"
		for _, h := range readmeHeading.FindAllSubmatch(readme[:m[0]], -1) {
			heading = string(h[1])
		}
		blocks = append(blocks, readmeYAML{heading: heading, body: string(readme[m[2]:m[3]])})
	}
	return blocks
}

// TestReadmeConfigsLoad checks every configuration the README shows with
// the real loader, as `tollgate -check-config` does, so that the README
// cannot drift from the code: the configuration reference as it stands,
// each fragment (such as the replica set-up) laid over the reference, and
// the example configuration the README's commands run on.
func TestReadmeConfigsLoad(t *testing.T) {
	// The variables the README's examples name; the loader expands them.
	for name, value := range map[string]string{
		"TOLLGATE_DEV_KEY":    "sk-readme-example-key-0123456789",
		"VLLM_KEY":            "upstream-key",
		"TOLLGATE_PG_DSN":     "postgres://tollgate@db.internal:5432/tollgate",
		"TOLLGATE_REDIS_ADDR": "redis.internal:6379",
		"TOLLGATE_CONFIG":     "",
	} {
		t.Setenv(name, value)
	}
	blocks := readmeYAMLBlocks(t)
	var reference string
	for _, b := range blocks {
		if b.heading == "Configuration reference" {
			reference = b.body
		}
	}
	if reference == "" {
		t.Fatal("README.md has no ```yaml block under \"## Configuration reference\"")
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
			t.Fatalf("the README's configuration fails the loader:\n%v\n%s", err, body)
		}
		if !strings.Contains(out.String(), "configuration is valid") {
			t.Fatalf("-check-config said %q", out.String())
		}
	}
	t.Run("reference", func(t *testing.T) { check(t, "reference.yaml", reference) })
	for _, b := range blocks {
		if b.body == reference {
			continue
		}
		t.Run("fragment under "+b.heading, func(t *testing.T) {
			check(t, "fragment.yaml", overlay(t, reference, b.body))
		})
	}
	t.Run("config.example.yaml", func(t *testing.T) {
		body, err := os.ReadFile("../../config.example.yaml")
		if err != nil {
			t.Fatal(err)
		}
		check(t, "config.example.yaml", string(body))
	})
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
		t.Fatalf("a README YAML block does not parse: %v\n%s", err, fragment)
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
