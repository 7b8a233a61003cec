package config

import (
	"errors"
	"strings"
	"testing"
)

// TestParseReportsEveryProblemInOnePass checks that a file with syntax-level
// problems (an unknown key, a value of the wrong type, an unset variable)
// and semantic ones (a dangling backend name, a short key) gets all of them
// back from one load, in file order, and nothing about what was refused
// twice.
func TestParseReportsEveryProblemInOnePass(t *testing.T) {
	text := `listen: "127.0.0.1:8080"
auth:
  keys:
    - name: k
      key: short
server:
  max_body_bytes: lots
  max_mesages: 10
backends:
  - name: a
    url: "http://a:8000/v1"
    weight: ${UNSET_WEIGHT}
models:
  - name: m
    backends: [b]
`
	_, err := parse([]byte(text), "one.yaml", "", noEnv)
	if err == nil {
		t.Fatal("the file loaded")
	}
	var lines []string
	for _, e := range splitJoined(err) {
		lines = append(lines, e.Error())
	}
	want := []string{
		`one.yaml: line 5: auth.keys[0].key: must be at least`,
		`one.yaml: line 7: server.max_body_bytes: want an integer, got "lots"`,
		`one.yaml: line 8: server: unknown key "max_mesages"`,
		`one.yaml: line 12: backends[0].weight: environment variable UNSET_WEIGHT is not set`,
		`one.yaml: line 15: models[0].backends[0]: no backend named "b"`,
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(lines), len(want), strings.Join(lines, "\n"))
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("problem %d = %q, want it to start with %q\nall:\n%s", i, lines[i], w, strings.Join(lines, "\n"))
		}
	}
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Line != 5 {
		t.Errorf("the first FieldError is %+v, want line 5", fe)
	}
}

// TestParseDoesNotRepeatPrunedProblems checks that a part refused by the
// walk is not reported again by Validate once it was pruned: a list item of
// the wrong kind is one problem, not also a missing name and URL.
func TestParseDoesNotRepeatPrunedProblems(t *testing.T) {
	text := `auth:
  keys:
    - {name: dev, key: sk-test-0001}
backends:
  - name: demo
    simulated: {}
  - just-a-string
models:
  - name: demo
    backends: [demo]
`
	_, err := parse([]byte(text), "p.yaml", "", noEnv)
	if err == nil {
		t.Fatal("the file loaded")
	}
	errs := splitJoined(err)
	if len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), "p.yaml: line 7: backends[1]: want a mapping") {
		t.Errorf("got %d problems, want the one refused item:\n%v", len(errs), err)
	}
}
