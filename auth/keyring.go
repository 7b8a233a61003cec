// Package auth resolves the API key a request presents to the configured
// key it belongs to, and answers what that key may do.
package auth

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"sync/atomic"

	"github.com/tollgate-dev/tollgate/config"
)

// Key is a configured API key, without its secret.
type Key struct {
	Name        string
	DefaultTeam string
	Admin       bool
	// Project is the OpenAI project (see package org) of a key created
	// through the Admin API; "" for a configured key.
	Project string
	// anyTeam is true when the key's teams include "*".
	anyTeam bool
	teams   map[string]struct{}
	digest  [sha256.Size]byte
}

// AllowsTeam reports whether the key may charge and read team.
func (k *Key) AllowsTeam(team string) bool {
	if k.Admin || k.anyTeam {
		return true
	}
	_, ok := k.teams[team]
	return ok
}

// AllowsAnyTeam reports whether the key may use every team, so that reads
// need no per-team filter.
func (k *Key) AllowsAnyTeam() bool { return k.Admin || k.anyTeam }

// Teams lists the teams a key may use; it is empty for a key that may use
// any team (see AllowsAnyTeam).
func (k *Key) Teams() []string {
	if k.AllowsAnyTeam() {
		return nil
	}
	out := make([]string, 0, len(k.teams))
	for t := range k.teams {
		out = append(out, t)
	}
	return out
}

// Keyring holds the configured keys by the SHA-256 of their secret, so that
// the process keeps no secret once it is built and key_sha256 entries need
// no special case. Its keys can be replaced while it is in use (a config
// reload): every holder of the Keyring sees the new keys at once.
//
// Beside them it holds the runtime keys, created through the Admin API,
// in an immutable map by digest swapped whole when they change, so that a
// lookup takes no lock and a replica holds thousands of them.
type Keyring struct {
	keys    atomic.Pointer[[]*Key]
	runtime atomic.Pointer[map[[sha256.Size]byte]*Key]
	// found is the secrets Lookup found since the keys last changed (see
	// Known); each change installs an empty one.
	found atomic.Pointer[foundSecrets]
}

// foundSecrets remembers secrets by a 64-bit hash under a seed of its own,
// unknown outside the process, in a table of foundSlots entries where a
// secret takes the place of the one before it in its slot.
type foundSecrets struct {
	seed  maphash.Seed
	slots [foundSlots]atomic.Uint64
}

// foundSlots is how many secrets a foundSecrets holds at most: the keys
// in use at once, as a rule. A secret pushed out is hashed with SHA-256
// again, by Lookup.
const foundSlots = 256

func newFoundSecrets() *foundSecrets { return &foundSecrets{seed: maphash.MakeSeed()} }

// entry is secret's slot and the word it holds there (never zero, which
// marks an empty slot).
func (f *foundSecrets) entry(secret []byte) (*atomic.Uint64, uint64) {
	h := maphash.Bytes(f.seed, secret) | 1
	return &f.slots[h%foundSlots], h
}

// add records secret. A secret already there is not written again, so
// that the requests of one key, on every core, only read its slot.
func (f *foundSecrets) add(secret []byte) {
	slot, h := f.entry(secret)
	if slot.Load() != h {
		slot.Store(h)
	}
}

func (f *foundSecrets) has(secret []byte) bool {
	slot, h := f.entry(secret)
	return slot.Load() == h
}

// RuntimeKey is the key of an Admin API project's service account: named
// by its id, it charges the team that is the project (its only team).
func RuntimeKey(id, project string, digest [sha256.Size]byte) *Key {
	return &Key{Name: id, DefaultTeam: project, Project: project,
		teams: map[string]struct{}{project: {}}, digest: digest}
}

// SetRuntime installs the runtime keys, by digest; keys must not change
// afterwards. Nil removes them all.
func (kr *Keyring) SetRuntime(keys map[[sha256.Size]byte]*Key) {
	kr.runtime.Store(&keys)
	kr.found.Store(newFoundSecrets())
}

// NewKeyring builds a Keyring from validated configuration.
func NewKeyring(cfg config.Auth) (*Keyring, error) {
	kr := &Keyring{}
	if err := kr.Replace(cfg); err != nil {
		return nil, err
	}
	return kr, nil
}

// Replace installs the keys of cfg. On error the previous keys stay.
func (kr *Keyring) Replace(cfg config.Auth) error {
	keys, err := buildKeys(cfg)
	if err != nil {
		return err
	}
	kr.keys.Store(&keys)
	kr.found.Store(newFoundSecrets())
	return nil
}

func buildKeys(cfg config.Auth) ([]*Key, error) {
	keys := make([]*Key, 0, len(cfg.Keys))
	for i, ck := range cfg.Keys {
		k := &Key{Name: ck.Name, DefaultTeam: ck.DefaultTeam, Admin: ck.Admin, teams: make(map[string]struct{}, len(ck.Teams))}
		for _, t := range ck.Teams {
			if t == "*" {
				k.anyTeam = true
				continue
			}
			k.teams[t] = struct{}{}
		}
		if ck.KeySHA256 != "" {
			b, err := hex.DecodeString(ck.KeySHA256)
			if err != nil || len(b) != sha256.Size {
				return nil, fmt.Errorf("auth.keys[%d].key_sha256: want 64 hex characters", i)
			}
			copy(k.digest[:], b)
		} else {
			k.digest = sha256.Sum256([]byte(ck.Key))
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// Lookup returns the key whose secret is secret, or nil. It compares the
// digest against every configured key in constant time and does not stop
// at the first match, so timing tells nothing about which key, if any,
// matched. Runtime keys are then found by digest in a map: a digest
// reveals nothing of a secret, so the map's timing does not either.
func (kr *Keyring) Lookup(secret []byte) *Key {
	if len(secret) == 0 {
		return nil
	}
	// Taken before the keys are read: a lookup that races with a change of
	// keys records its secret in the table the change discards.
	found := kr.found.Load()
	key := kr.lookup(secret)
	if key != nil && found != nil {
		found.add(secret)
	}
	return key
}

// Known reports whether secret is a key's secret, for a check that only
// bounds what a request may cost before it is authenticated (how much of
// its body is read): a secret Lookup found since the keys last changed is
// known without its SHA-256, by its hash in a table of found secrets;
// another is looked up. Unlike Lookup, it may take a secret whose hash
// under the table's seed, which never leaves the process, is a found
// secret's (about one chance in 2^64): never authenticate with it.
func (kr *Keyring) Known(secret []byte) bool {
	if len(secret) == 0 {
		return false
	}
	if found := kr.found.Load(); found != nil && found.has(secret) {
		return true
	}
	return kr.Lookup(secret) != nil
}

// lookup is Lookup without recording what it finds.
func (kr *Keyring) lookup(secret []byte) *Key {
	d := sha256.Sum256(secret)
	var found *Key
	for _, k := range *kr.keys.Load() {
		if subtle.ConstantTimeCompare(d[:], k.digest[:]) == 1 {
			found = k
		}
	}
	if found == nil {
		if rt := kr.runtime.Load(); rt != nil {
			found = (*rt)[d]
		}
	}
	return found
}

var (
	bearerPrefix = []byte("Bearer ")
	basicPrefix  = []byte("Basic ")
)

// Secret extracts the API key from an Authorization header value:
// "Bearer <key>", or "Basic base64(user:<key>)" where the password is the
// key and the user name is ignored. dst is reused for the decoded Basic
// credentials; the result may alias header or dst.
func Secret(dst, header []byte) []byte {
	switch {
	case hasPrefixFold(header, bearerPrefix):
		return bytes.TrimSpace(header[len(bearerPrefix):])
	case hasPrefixFold(header, basicPrefix):
		enc := bytes.TrimSpace(header[len(basicPrefix):])
		n := base64.StdEncoding.DecodedLen(len(enc))
		if cap(dst) < n {
			dst = make([]byte, n)
		}
		dst = dst[:n]
		m, err := base64.StdEncoding.Decode(dst, enc)
		if err != nil {
			return nil
		}
		dst = dst[:m]
		i := bytes.IndexByte(dst, ':')
		if i < 0 {
			return nil
		}
		return dst[i+1:]
	}
	return nil
}

// hasPrefixFold reports whether s starts with prefix, ignoring ASCII case
// of the scheme as RFC 7235 asks. The scheme nearly always comes as
// written in prefix, which an exact comparison settles in a few
// instructions, where EqualFold folds it byte by byte.
func hasPrefixFold(s, prefix []byte) bool {
	return len(s) >= len(prefix) && (bytes.Equal(s[:len(prefix)], prefix) || bytes.EqualFold(s[:len(prefix)], prefix))
}
