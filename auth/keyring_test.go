package auth

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"testing"

	"github.com/tollgate-dev/tollgate/config"
)

func TestKeyringLookup(t *testing.T) {
	sum := sha256.Sum256([]byte("sk-hashed-secret"))
	kr, err := NewKeyring(config.Auth{Keys: []config.Key{
		{Name: "plain", Key: "sk-plain-secret", Teams: []string{"acme"}, DefaultTeam: "acme"},
		{Name: "hashed", KeySHA256: hex.EncodeToString(sum[:]), Teams: []string{"*"}, DefaultTeam: "beta"},
		{Name: "root", Key: "sk-root-secret", Admin: true, DefaultTeam: "ops"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		secret string
		want   string
	}{
		{"sk-plain-secret", "plain"},
		{"sk-hashed-secret", "hashed"},
		{"sk-root-secret", "root"},
		{"sk-plain-secreT", ""},
		{"", ""},
	}
	for _, tt := range tests {
		t.Run(tt.secret, func(t *testing.T) {
			k := kr.Lookup([]byte(tt.secret))
			got := ""
			if k != nil {
				got = k.Name
			}
			if got != tt.want {
				t.Fatalf("Lookup(%q) = %q, want %q", tt.secret, got, tt.want)
			}
		})
	}
	plain := kr.Lookup([]byte("sk-plain-secret"))
	if !plain.AllowsTeam("acme") || plain.AllowsTeam("beta") || plain.AllowsAnyTeam() {
		t.Fatalf("plain key team rights wrong")
	}
	if !kr.Lookup([]byte("sk-hashed-secret")).AllowsTeam("anything") {
		t.Fatalf("wildcard key must allow any team")
	}
	if !kr.Lookup([]byte("sk-root-secret")).AllowsTeam("anything") {
		t.Fatalf("admin key must allow any team")
	}
}

func TestKeyringRejectsBadDigest(t *testing.T) {
	if _, err := NewKeyring(config.Auth{Keys: []config.Key{{Name: "x", KeySHA256: "zz"}}}); err == nil {
		t.Fatal("want error for a non-hex key_sha256")
	}
}

func TestSecret(t *testing.T) {
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("anyone:sk-123"))
	tests := []struct {
		name, header, want string
	}{
		{"bearer", "Bearer sk-123", "sk-123"},
		{"bearer lower-case scheme", "bearer sk-123", "sk-123"},
		{"basic password is the key", basic, "sk-123"},
		{"basic without colon", "Basic " + base64.StdEncoding.EncodeToString([]byte("sk-123")), ""},
		{"basic not base64", "Basic !!!", ""},
		{"unknown scheme", "Token sk-123", ""},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(Secret(nil, []byte(tt.header))); got != tt.want {
				t.Fatalf("Secret(%q) = %q, want %q", tt.header, got, tt.want)
			}
		})
	}
}

func TestKeyringReplace(t *testing.T) {
	kr, err := NewKeyring(config.Auth{Keys: []config.Key{{Name: "old", Key: "sk-old-secret"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := kr.Replace(config.Auth{Keys: []config.Key{{Name: "new", Key: "sk-new-secret"}}}); err != nil {
		t.Fatal(err)
	}
	if kr.Lookup([]byte("sk-old-secret")) != nil || kr.Lookup([]byte("sk-new-secret")) == nil {
		t.Fatal("Replace did not swap the keys")
	}
	if err := kr.Replace(config.Auth{Keys: []config.Key{{Name: "bad", KeySHA256: "nothex"}}}); err == nil {
		t.Fatal("want an error for a bad digest")
	}
	if kr.Lookup([]byte("sk-new-secret")) == nil {
		t.Fatal("a failed Replace must keep the previous keys")
	}
}

func TestKeyringRuntimeKeys(t *testing.T) {
	kr, err := NewKeyring(config.Auth{Keys: []config.Key{{Name: "yaml", Key: "sk-yaml", Teams: []string{"*"}, DefaultTeam: "t"}}})
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256([]byte("sk-svcacct-one"))
	kr.SetRuntime(map[[sha256.Size]byte]*Key{digest: RuntimeKey("key_one", "proj_a", digest)})
	k := kr.Lookup([]byte("sk-svcacct-one"))
	if k == nil || k.Name != "key_one" || k.Project != "proj_a" || k.DefaultTeam != "proj_a" {
		t.Fatalf("runtime key = %+v", k)
	}
	if !k.AllowsTeam("proj_a") || k.AllowsTeam("proj_b") || k.AllowsAnyTeam() || k.Admin {
		t.Fatal("a runtime key may use its project's team only, and is no admin")
	}
	if y := kr.Lookup([]byte("sk-yaml")); y == nil || y.Name != "yaml" || y.Project != "" {
		t.Fatalf("configured key = %+v", y)
	}
	if allocs := testing.AllocsPerRun(100, func() { kr.Lookup([]byte("sk-svcacct-one")) }); allocs != 0 {
		t.Fatalf("runtime lookup allocates %v times", allocs)
	}
	kr.SetRuntime(nil)
	if kr.Lookup([]byte("sk-svcacct-one")) != nil {
		t.Fatal("a removed runtime key still authenticates")
	}
}

// TestKeyringKnown checks that Known takes a key's secret, found or not yet, refuses others, and
// forgets the secrets found once the keys change (by Replace or SetRuntime).
func TestKeyringKnown(t *testing.T) {
	runtimeDigest := sha256.Sum256([]byte("sk-svcacct-one"))
	runtimeKeys := map[[sha256.Size]byte]*Key{runtimeDigest: RuntimeKey("key_one", "proj_a", runtimeDigest)}
	tests := []struct {
		name   string
		change func(kr *Keyring) error // after the secrets were found
		secret string
		want   bool
	}{
		{name: "a configured key", secret: "sk-yaml", want: true},
		{name: "a runtime key", secret: "sk-svcacct-one", want: true},
		{name: "an unknown secret", secret: "sk-nobody", want: false},
		{name: "no secret", secret: "", want: false},
		{name: "a configured key once Replace removed it", secret: "sk-yaml", want: false,
			change: func(kr *Keyring) error {
				return kr.Replace(config.Auth{Keys: []config.Key{{Name: "other", Key: "sk-other"}}})
			}},
		{name: "a runtime key once SetRuntime removed it", secret: "sk-svcacct-one", want: false,
			change: func(kr *Keyring) error { kr.SetRuntime(nil); return nil }},
		{name: "a configured key kept by Replace", secret: "sk-yaml", want: true,
			change: func(kr *Keyring) error {
				return kr.Replace(config.Auth{Keys: []config.Key{{Name: "yaml", Key: "sk-yaml"}}})
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kr, err := NewKeyring(config.Auth{Keys: []config.Key{{Name: "yaml", Key: "sk-yaml"}}})
			if err != nil {
				t.Fatal(err)
			}
			kr.SetRuntime(runtimeKeys)
			// Known before anything was found, then after Lookup found the keys.
			if got := kr.Known([]byte(tt.secret)); got != tt.want && tt.change == nil {
				t.Fatalf("Known before any lookup = %v, want %v", got, tt.want)
			}
			for _, s := range []string{"sk-yaml", "sk-svcacct-one", "sk-nobody"} {
				kr.Lookup([]byte(s))
			}
			if tt.change != nil {
				if err := tt.change(kr); err != nil {
					t.Fatal(err)
				}
			}
			if got := kr.Known([]byte(tt.secret)); got != tt.want {
				t.Errorf("Known = %v, want %v", got, tt.want)
			}
			if got := kr.Lookup([]byte(tt.secret)) != nil; got != tt.want {
				t.Errorf("the case is mislabelled: Lookup found it = %v", got)
			}
		})
	}
	t.Run("a found secret is known without a lookup, and with no allocation", func(t *testing.T) {
		kr, err := NewKeyring(config.Auth{Keys: []config.Key{{Name: "yaml", Key: "sk-yaml"}}})
		if err != nil {
			t.Fatal(err)
		}
		found := kr.found.Load()
		if found.has([]byte("sk-yaml")) {
			t.Fatal("found before any lookup")
		}
		kr.Lookup([]byte("sk-yaml"))
		if !found.has([]byte("sk-yaml")) || found.has([]byte("sk-yaml2")) {
			t.Fatal("Lookup did not record the secret it found, or recorded another")
		}
		if allocs := testing.AllocsPerRun(100, func() { kr.Known([]byte("sk-yaml")) }); allocs != 0 {
			t.Fatalf("Known allocates %v times", allocs)
		}
	})
}
