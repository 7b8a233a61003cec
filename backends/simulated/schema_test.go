package simulated

import (
	"fmt"
	"math"
	"regexp"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// validate checks doc against the subset of JSON Schema the generator claims to honour, and
// returns the first violation. It is written independently of the generator, from the keywords'
// definitions.
func validate(root, s, doc gjson.Result, path string) error {
	for i := 0; i < 16; i++ {
		ref := s.Get(`\$ref`)
		if ref.Type != gjson.String {
			break
		}
		p := strings.TrimPrefix(ref.Str, "#")
		s = root
		for _, seg := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
			if seg != "" {
				s = s.Get(gjsonEscape(seg))
			}
		}
	}
	if c := s.Get("const"); c.Exists() && c.Raw != doc.Raw {
		return fmt.Errorf("%s: %s is not the const %s", path, doc.Raw, c.Raw)
	}
	if e := s.Get("enum"); e.IsArray() {
		found := false
		for _, v := range e.Array() {
			found = found || v.Raw == doc.Raw
		}
		if !found {
			return fmt.Errorf("%s: %s not in enum %s", path, doc.Raw, e.Raw)
		}
	}
	if any := s.Get("anyOf"); any.IsArray() {
		for _, alt := range any.Array() {
			if validate(root, alt, doc, path) == nil {
				return nil
			}
		}
		return fmt.Errorf("%s: %s matches no anyOf alternative", path, doc.Raw)
	}
	for _, sub := range s.Get("allOf").Array() {
		if err := validate(root, sub, doc, path); err != nil {
			return err
		}
	}
	if t := s.Get("type"); t.Exists() {
		types := []string{t.Str}
		if t.IsArray() {
			types = nil
			for _, x := range t.Array() {
				types = append(types, x.Str)
			}
		}
		ok := false
		for _, typ := range types {
			ok = ok || isType(doc, typ)
		}
		if !ok {
			return fmt.Errorf("%s: %s is not of type %s", path, doc.Raw, t.Raw)
		}
	}
	switch {
	case doc.IsObject():
		props := s.Get("properties")
		for _, r := range s.Get("required").Array() {
			if !doc.Get(gjsonEscape(r.Str)).Exists() {
				return fmt.Errorf("%s: required %q missing in %s", path, r.Str, doc.Raw)
			}
		}
		var err error
		doc.ForEach(func(k, v gjson.Result) bool {
			ps := props.Get(gjsonEscape(k.Str))
			switch {
			case ps.Exists():
				err = validate(root, ps, v, path+"."+k.Str)
			case s.Get("additionalProperties").Type == gjson.False:
				err = fmt.Errorf("%s: additional property %q", path, k.Str)
			}
			return err == nil
		})
		if err != nil {
			return err
		}
		if m := s.Get("minProperties"); m.Exists() && int64(len(doc.Map())) < m.Int() {
			return fmt.Errorf("%s: fewer than %d properties", path, m.Int())
		}
	case doc.IsArray():
		items := doc.Array()
		if m := s.Get("minItems"); m.Exists() && int64(len(items)) < m.Int() {
			return fmt.Errorf("%s: %d items, minItems %d", path, len(items), m.Int())
		}
		if m := s.Get("maxItems"); m.Exists() && int64(len(items)) > m.Int() {
			return fmt.Errorf("%s: %d items, maxItems %d", path, len(items), m.Int())
		}
		for i, it := range items {
			if err := validate(root, s.Get("items"), it, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		if s.Get("uniqueItems").Type == gjson.True {
			seen := map[string]bool{}
			for _, it := range items {
				if seen[it.Raw] {
					return fmt.Errorf("%s: duplicate item %s", path, it.Raw)
				}
				seen[it.Raw] = true
			}
		}
	case doc.Type == gjson.Number:
		if m := s.Get("minimum"); m.Exists() && doc.Num < m.Num {
			return fmt.Errorf("%s: %v < minimum %v", path, doc.Num, m.Num)
		}
		if m := s.Get("maximum"); m.Exists() && doc.Num > m.Num {
			return fmt.Errorf("%s: %v > maximum %v", path, doc.Num, m.Num)
		}
		if m := s.Get("exclusiveMinimum"); m.Type == gjson.Number && doc.Num <= m.Num {
			return fmt.Errorf("%s: %v <= exclusiveMinimum %v", path, doc.Num, m.Num)
		}
		if m := s.Get("exclusiveMaximum"); m.Type == gjson.Number && doc.Num >= m.Num {
			return fmt.Errorf("%s: %v >= exclusiveMaximum %v", path, doc.Num, m.Num)
		}
		if m := s.Get("multipleOf"); m.Exists() {
			if q := doc.Num / m.Num; math.Abs(q-math.Round(q)) > 1e-9 {
				return fmt.Errorf("%s: %v not a multiple of %v", path, doc.Num, m.Num)
			}
		}
	case doc.Type == gjson.String:
		n := len([]rune(doc.Str))
		if m := s.Get("minLength"); m.Exists() && int64(n) < m.Int() {
			return fmt.Errorf("%s: %q shorter than %d", path, doc.Str, m.Int())
		}
		if m := s.Get("maxLength"); m.Exists() && int64(n) > m.Int() {
			return fmt.Errorf("%s: %q longer than %d", path, doc.Str, m.Int())
		}
		if p := s.Get("pattern"); p.Exists() && !regexp.MustCompile(p.Str).MatchString(doc.Str) {
			return fmt.Errorf("%s: %q does not match %s", path, doc.Str, p.Str)
		}
	}
	return nil
}

func isType(doc gjson.Result, typ string) bool {
	switch typ {
	case "object":
		return doc.IsObject()
	case "array":
		return doc.IsArray()
	case "string":
		return doc.Type == gjson.String
	case "number":
		return doc.Type == gjson.Number
	case "integer":
		return doc.Type == gjson.Number && doc.Num == math.Trunc(doc.Num) && !strings.ContainsAny(doc.Raw, ".eE")
	case "boolean":
		return doc.Type == gjson.True || doc.Type == gjson.False
	case "null":
		return doc.Type == gjson.Null
	}
	return false
}

// schemaCases are schemas as clients write them; zodObject is what zod 4's toJSONSchema writes
// (through OpenAI's zodResponseFormat and the AI SDK's generateObject).
var schemaCases = []struct{ name, schema string }{
	{"flat object", `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"ok":{"type":"boolean"},"score":{"type":"number"}},"required":["name","age","ok","score"],"additionalProperties":false}`},
	{"optional properties", `{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}},"required":["a"]}`},
	{"zod object", `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":-9007199254740991,"maximum":9007199254740991},"tags":{"type":"array","items":{"type":"string"}},"address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string"}},"required":["city"],"additionalProperties":false},"role":{"type":"string","enum":["admin","user"]},"active":{"type":"boolean"}},"required":["name","age","tags","address","role","active"],"additionalProperties":false}`},
	{"arrays within bounds", `{"type":"object","properties":{"few":{"type":"array","items":{"type":"integer","minimum":3,"maximum":5},"minItems":4,"maxItems":6},"one":{"type":"array","items":{"type":"string"},"maxItems":1},"set":{"type":"array","items":{"enum":["x","y","z"]},"minItems":3,"uniqueItems":true}},"required":["few","one","set"]}`},
	{"strings", `{"type":"object","properties":{"c":{"const":"fixed"},"e":{"type":"string","enum":["red","green"]},"long":{"type":"string","minLength":30},"short":{"type":"string","maxLength":3},"when":{"type":"string","format":"date-time"},"mail":{"type":"string","format":"email"},"code":{"type":"string","pattern":"^[A-Z]{3}-\\d{2,4}$"}},"required":["c","e","long","short","when","mail","code"]}`},
	{"numbers", `{"type":"object","properties":{"p":{"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1},"m":{"type":"integer","multipleOf":5,"minimum":7,"maximum":40},"neg":{"type":"integer","maximum":-10},"f":{"type":"number","minimum":2.5,"maximum":2.5}},"required":["p","m","neg","f"]}`},
	{"nullable and anyOf", `{"type":"object","properties":{"n":{"type":["string","null"]},"u":{"anyOf":[{"type":"integer"},{"type":"string"}]},"z":{"anyOf":[{"type":"null"},{"type":"boolean"}]}},"required":["n","u","z"],"additionalProperties":false}`},
	{"refs and defs", `{"type":"object","properties":{"owner":{"$ref":"#/$defs/person"},"staff":{"type":"array","items":{"$ref":"#/definitions/person"},"minItems":2}},"required":["owner","staff"],"$defs":{"person":{"type":"object","properties":{"name":{"type":"string"},"boss":{"$ref":"#/$defs/person"}},"required":["name"],"additionalProperties":false}},"definitions":{"person":{"$ref":"#/$defs/person"}}}`},
	{"allOf", `{"allOf":[{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]},{"type":"object","properties":{"b":{"type":"integer"}},"required":["b"]}]}`},
	{"top-level array", `{"type":"array","items":{"type":"object","properties":{"k":{"type":"string"}},"required":["k"]},"minItems":1,"maxItems":2}`},
	{"untyped", `{"properties":{"x":{"minimum":1,"maximum":2}},"required":["x"]}`},
}

func TestGenDocumentValidAgainstSchema(t *testing.T) {
	for _, tt := range schemaCases {
		t.Run(tt.name, func(t *testing.T) {
			schema := gjson.Parse(tt.schema)
			// Several seeds, so that random choices (enum members, optional branches) vary.
			for seed := uint64(0); seed < 20; seed++ {
				doc := genDocument(schema, &rng{state: seed})
				if !gjson.Valid(doc) {
					t.Fatalf("seed %d: not JSON: %s", seed, doc)
				}
				if err := validate(schema, schema, gjson.Parse(doc), "$"); err != nil {
					t.Fatalf("seed %d: %v\n%s", seed, err, doc)
				}
			}
		})
	}
}

func TestGenDocumentDeterministic(t *testing.T) {
	schema := gjson.Parse(schemaCases[2].schema)
	a, b := genDocument(schema, &rng{state: 7}), genDocument(schema, &rng{state: 7})
	c := genDocument(schema, &rng{state: 8})
	if a != b {
		t.Errorf("same seed, different documents:\n%s\n%s", a, b)
	}
	if a == c {
		t.Errorf("another seed, the same document: %s", a)
	}
}

func TestGenDocumentOptionalAndRequired(t *testing.T) {
	schema := gjson.Parse(`{"type":"object","properties":{"req":{"type":"string"},"opt":{"type":"integer"}},"required":["req"],"additionalProperties":false}`)
	doc := gjson.Parse(genDocument(schema, &rng{}))
	if !doc.Get("req").Exists() || doc.Get("req").Type != gjson.String {
		t.Errorf("required property missing: %s", doc.Raw)
	}
	if doc.Get("opt").Exists() && doc.Get("opt").Type != gjson.Number {
		t.Errorf("optional property of the wrong type: %s", doc.Raw)
	}
	if n := len(doc.Map()); n > 2 {
		t.Errorf("additional properties generated: %s", doc.Raw)
	}
}

func TestGenRegex(t *testing.T) {
	tests := []struct {
		pattern string
		ok      bool
	}{
		{`^[a-z]+@[a-z]+\.com$`, true},
		{`\d{3}-\d{4}`, true},
		{`(yes|no|maybe)`, true},
		{`^[A-F0-9]{8}$`, true},
		{`colou?r`, true},
		{`(`, false},
	}
	for _, tt := range tests {
		t.Run(tt.pattern, func(t *testing.T) {
			s, ok := genRegex(tt.pattern, &rng{state: 3})
			if ok != tt.ok {
				t.Fatalf("ok %v, want %v (%q)", ok, tt.ok, s)
			}
			if ok && !regexp.MustCompile(tt.pattern).MatchString(s) {
				t.Errorf("%q does not match %s", s, tt.pattern)
			}
		})
	}
}
