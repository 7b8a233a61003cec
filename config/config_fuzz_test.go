package config

import (
	"errors"
	"testing"
)

// FuzzParse checks that Parse never panics, whatever it is given, and that
// what it accepts is valid: a nil error means the Config passes Validate,
// also after a second Provision.
func FuzzParse(f *testing.F) {
	seeds := []string{
		fullYAML,
		minimalYAML,
		minimalYAML + "listen: ${TOLLGATE_FUZZ_UNSET:-127.0.0.1:0}\n",
		minimalYAML + "usage: {flush_interval: five}\n",
		minimalYAML + "lisen: x\n",
		minimalYAML + "listen: [\n",
		minimalYAML + "---\nlisten: x\n",
		minimalYAML + "limits:\n  - &l {team: a, rpm: 1}\n  - *l\n  - {<<: *l, team: b}\n",
		minimalYAML + "store: {driver: postgres}\n",
		minimalYAML + "backends: [{name: x, url: \"http://h/v1?q\"}]\n",
		"auth: {keys: [{name: k, key_sha256: " + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" + "}]}\n",
		"a: &a [*a]\n",
		"- 1\n- 2\n",
		"~\n",
		"# only a comment\n",
		"",
		"\t",
		"${X}: $$\n",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data, "fuzz.yaml")
		if err != nil {
			if cfg != nil {
				t.Fatalf("Parse returned a Config with error %v", err)
			}
			var fe *FieldError
			if errors.As(err, &fe) && fe.Err == nil {
				t.Fatalf("FieldError without a problem: %v", err)
			}
			return
		}
		if cfg == nil {
			t.Fatal("Parse returned neither a Config nor an error")
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Parse accepted a config that Validate refuses: %v\ninput:\n%s", err, data)
		}
		cfg.Provision()
		if err := cfg.Validate(); err != nil {
			t.Fatalf("a second Provision broke a valid config: %v\ninput:\n%s", err, data)
		}
	})
}
