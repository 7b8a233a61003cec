package proxy

import (
	"cmp"
	"slices"
	"strings"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
)

// redacted stands in for a secret removed from text.
const redacted = "[redacted]"

// minSecretPrefix is the shortest tail of a text that is taken for the
// start of a secret cut off by a clip; shorter tails are too likely to be
// ordinary words.
const minSecretPrefix = 4

// secretValues redacts the gateway's own secrets by value: the backends'
// API keys and the client keys the configuration holds in plaintext. A
// backend's error text can repeat the key it was sent in any shape (bare,
// quoted, in a sentence), which no pattern recognises; the value itself
// is known. One is built per configuration generation (see Server.Swap),
// and it runs on error text only: a backend's error passed on to the
// client, and a record's error text before it is logged, stored and shown
// in traces.
type secretValues struct {
	// secrets are longest first, so that a secret holding another is
	// replaced whole.
	secrets []string
}

// newSecretValues collects the secrets of cfg.
func newSecretValues(cfg *config.Config) *secretValues {
	var secrets []string
	for _, b := range cfg.Backends {
		secrets = append(secrets, b.APIKey)
	}
	for _, k := range cfg.Auth.Keys {
		secrets = append(secrets, k.Key)
	}
	secrets = slices.DeleteFunc(secrets, func(s string) bool { return s == "" })
	slices.SortFunc(secrets, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	return &secretValues{secrets: slices.Compact(secrets)}
}

// redact returns s with every secret replaced, and a secret's start left at
// the end of s by a clip (before clip's "…") replaced too.
func (v *secretValues) redact(s string) string {
	if v == nil || s == "" {
		return s
	}
	// The cut start first: it can hold a shorter secret whole, whose
	// replacement would leave the rest of the longer one behind.
	body, ellipsis := strings.CutSuffix(s, "…")
	for _, secret := range v.secrets {
		for n := min(len(secret)-1, len(body)); n >= minSecretPrefix; n-- {
			if strings.HasSuffix(body, secret[:n]) {
				body = body[:len(body)-n] + redacted
				break
			}
		}
	}
	for _, secret := range v.secrets {
		if strings.Contains(body, secret) {
			body = strings.ReplaceAll(body, secret, redacted)
		}
	}
	if ellipsis {
		return body + "…"
	}
	return body
}

// record redacts what a usage record holds of a failure: its error text
// and, for a failed request, the reply kept as its trace's output. A
// record without an error is left as it is, at the cost of one comparison.
func (v *secretValues) record(rec *accounting.Record) {
	if rec.Error == "" || v == nil {
		return
	}
	rec.Error = v.redact(rec.Error)
	if len(rec.Output) > 0 {
		if out := v.redact(string(rec.Output)); out != string(rec.Output) {
			rec.Output = []byte(out)
		}
	}
}
