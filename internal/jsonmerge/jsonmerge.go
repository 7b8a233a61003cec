// Package jsonmerge applies JSON merge patches (RFC 7396) as SQLite's
// json_patch does, to the same text, so that both store engines and the
// domain rules that merge attributes produce identical rows.
package jsonmerge

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
)

// jsonMember is one member of a JSON object, its value as JSON text.
type jsonMember struct {
	key   string
	value json.RawMessage
}

// Patch applies patch to target as a JSON merge patch (RFC 7396) and
// returns the result as compact JSON. It merges as SQLite's json_patch
// does, to the same text: members keep their order, target's first and
// then new ones in patch order, so that a summary finished on PostgreSQL
// reads as one finished on SQLite.
func Patch(target, patch []byte) ([]byte, error) {
	var buf bytes.Buffer
	if err := writeMerged(&buf, target, patch); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeMerged writes target patched with patch to buf. A nil target is
// absent.
func writeMerged(buf *bytes.Buffer, target, patch json.RawMessage) error {
	pm, ok, err := jsonObject(patch)
	if err != nil {
		return err
	}
	if !ok {
		// Anything but an object replaces the target.
		return json.Compact(buf, patch)
	}
	var tm []jsonMember
	if target != nil {
		if tm, _, err = jsonObject(target); err != nil {
			return err
		}
	}
	type merged struct {
		key          string
		target, with json.RawMessage
	}
	out := make([]merged, len(tm), len(tm)+len(pm))
	for i, m := range tm {
		out[i] = merged{key: m.key, target: m.value}
	}
	for _, p := range pm {
		i := slices.IndexFunc(out, func(m merged) bool { return m.key == p.key })
		switch {
		case string(bytes.TrimSpace(p.value)) == "null":
			if i >= 0 {
				out = slices.Delete(out, i, i+1)
			}
		case i >= 0:
			out[i].with = p.value
		default:
			out = append(out, merged{key: p.key, with: p.value})
		}
	}
	buf.WriteByte('{')
	for i, m := range out {
		if i > 0 {
			buf.WriteByte(',')
		}
		if err := writeJSONString(buf, m.key); err != nil {
			return err
		}
		buf.WriteByte(':')
		if m.with != nil {
			err = writeMerged(buf, m.target, m.with)
		} else {
			err = json.Compact(buf, m.target)
		}
		if err != nil {
			return err
		}
	}
	buf.WriteByte('}')
	return nil
}

// writeJSONString writes s as a JSON string, without the HTML escaping of
// json.Marshal, which SQLite does not do.
func writeJSONString(buf *bytes.Buffer, s string) error {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return err
	}
	buf.Truncate(buf.Len() - 1) // Encode's newline
	return nil
}

// jsonObject returns the members of the JSON object b in order; ok is
// false when b is some other JSON value.
func jsonObject(b []byte) (members []jsonMember, ok bool, err error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return nil, false, err
	}
	if d, isDelim := tok.(json.Delim); !isDelim || d != '{' {
		return nil, false, nil
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false, err
		}
		key, isKey := tok.(string)
		if !isKey {
			return nil, false, errors.New("object key is not a string")
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false, err
		}
		members = append(members, jsonMember{key: key, value: v})
	}
	if _, err := dec.Token(); err != nil {
		return nil, false, err
	}
	return members, true, nil
}
