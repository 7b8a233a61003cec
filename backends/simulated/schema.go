package simulated

import (
	"math"
	"regexp"
	"regexp/syntax"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// JSON documents valid against a JSON schema, for response_format json_schema, structured_outputs
// json and tool arguments. The generator covers what structured-output clients send (OpenAI's
// zodResponseFormat, the Vercel AI SDK, LangChain, pydantic): objects with required and optional
// properties (additionalProperties false is respected by never adding any), arrays within
// minItems/maxItems (and prefixItems), strings with enum, const, format, pattern and length
// bounds, numbers and integers within their bounds and multipleOf, booleans, null, type lists
// (nullable types), $ref to local definitions ("#/$defs/…", "#/definitions/…", "#"), anyOf and
// oneOf (the first alternative), and allOf (the properties of all merged). Values are drawn from
// the request's generator, so a seed changes them and the same seed repeats them.

// maxSchemaDepth bounds recursion through $ref; deeper than this only required properties and
// minItems items are generated, and past twice this a null ends the document.
const maxSchemaDepth = 12

type schemaGen struct {
	root gjson.Result
	r    *rng
}

// genDocument generates a document valid against schema.
func genDocument(schema gjson.Result, r *rng) string {
	g := schemaGen{root: schema, r: r}
	return string(g.value(nil, schema, 0))
}

// resolve follows $ref (a local JSON pointer) until a schema without one.
func (g *schemaGen) resolve(s gjson.Result) gjson.Result {
	for i := 0; i < 16; i++ {
		ref := s.Get(`\$ref`)
		if ref.Type != gjson.String {
			return s
		}
		target, ok := g.pointer(ref.Str)
		if !ok {
			return gjson.Result{} // an unresolvable reference: anything is as good as nothing
		}
		s = target
	}
	return s
}

// pointer resolves a "#/a/b" JSON pointer against the root schema.
func (g *schemaGen) pointer(ref string) (gjson.Result, bool) {
	rest, ok := strings.CutPrefix(ref, "#")
	if !ok {
		return gjson.Result{}, false
	}
	cur := g.root
	for _, seg := range strings.Split(strings.TrimPrefix(rest, "/"), "/") {
		if seg == "" {
			continue
		}
		seg = strings.ReplaceAll(strings.ReplaceAll(seg, "~1", "/"), "~0", "~")
		cur = cur.Get(gjsonEscape(seg))
		if !cur.Exists() {
			return gjson.Result{}, false
		}
	}
	return cur, true
}

// gjsonEscape escapes the characters gjson gives meaning to in a path.
func gjsonEscape(s string) string {
	if !strings.ContainsAny(s, `.*?|#@\!=<>%"`) {
		return s
	}
	var b strings.Builder
	for _, c := range s {
		if strings.ContainsRune(`.*?|#@\!=<>%"`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// schemaType is the type to generate: the schema's type (the first that is not "null" of a
// list), else what its keywords imply.
func schemaType(s gjson.Result) string {
	t := s.Get("type")
	switch {
	case t.Type == gjson.String:
		return t.Str
	case t.IsArray():
		first := ""
		for _, x := range t.Array() {
			if first == "" {
				first = x.Str
			}
			if x.Str != "null" {
				return x.Str
			}
		}
		return first
	case s.Get("properties").Exists() || s.Get("required").Exists() || s.Get("additionalProperties").Exists():
		return "object"
	case s.Get("items").Exists() || s.Get("prefixItems").Exists():
		return "array"
	case s.Get("pattern").Exists() || s.Get("format").Exists() || s.Get("minLength").Exists():
		return "string"
	case s.Get("minimum").Exists() || s.Get("maximum").Exists():
		return "number"
	}
	return ""
}

func (g *schemaGen) value(b []byte, s gjson.Result, depth int) []byte {
	s = g.resolve(s)
	if depth > 2*maxSchemaDepth || !s.Exists() || s.Type == gjson.True {
		if depth > 2*maxSchemaDepth {
			return append(b, "null"...)
		}
		return append(b, `"value"`...)
	}
	if c := s.Get("const"); c.Exists() {
		return append(b, c.Raw...)
	}
	if e := s.Get("enum"); e.IsArray() {
		if vals := e.Array(); len(vals) > 0 {
			return append(b, vals[g.r.intn(len(vals))].Raw...)
		}
	}
	for _, key := range []string{"anyOf", "oneOf"} {
		if alts := s.Get(key); alts.IsArray() && len(alts.Array()) > 0 {
			return g.value(b, g.firstAlternative(alts.Array()), depth+1)
		}
	}
	if all := s.Get("allOf"); all.IsArray() {
		return g.allOf(b, s, all.Array(), depth)
	}
	switch schemaType(s) {
	case "object":
		return g.object(b, []gjson.Result{s}, depth)
	case "array":
		return g.array(b, s, depth)
	case "string":
		return g.str(b, s)
	case "integer":
		return g.integer(b, s)
	case "number":
		return g.number(b, s)
	case "boolean":
		if g.r.intn(2) == 0 {
			return append(b, "true"...)
		}
		return append(b, "false"...)
	case "null":
		return append(b, "null"...)
	}
	return append(b, `"value"`...)
}

// firstAlternative is the first alternative that is not {"type":"null"} (a nullable field's
// value is more useful to show), else the first.
func (g *schemaGen) firstAlternative(alts []gjson.Result) gjson.Result {
	for _, a := range alts {
		if schemaType(g.resolve(a)) != "null" {
			return a
		}
	}
	return alts[0]
}

// allOf generates an object from the properties of s and every subschema together, or the first
// subschema's value when they are not objects.
func (g *schemaGen) allOf(b []byte, s gjson.Result, subs []gjson.Result, depth int) []byte {
	parts := []gjson.Result{s}
	objects := schemaType(s) == "object"
	for _, sub := range subs {
		sub = g.resolve(sub)
		parts = append(parts, sub)
		objects = objects || schemaType(sub) == "object"
	}
	if !objects {
		if len(subs) == 0 {
			return append(b, `"value"`...)
		}
		return g.value(b, subs[0], depth+1)
	}
	return g.object(b, parts, depth)
}

// object generates an object with the properties of all parts, in their declared order:
// every required one, and the optional ones too unless the schema is deep in a recursion.
func (g *schemaGen) object(b []byte, parts []gjson.Result, depth int) []byte {
	required := map[string]bool{}
	for _, p := range parts {
		for _, r := range p.Get("required").Array() {
			required[r.Str] = true
		}
	}
	b = append(b, '{')
	seen := map[string]bool{}
	n := 0
	for _, p := range parts {
		p.Get("properties").ForEach(func(k, v gjson.Result) bool {
			if seen[k.Str] || (!required[k.Str] && depth >= maxSchemaDepth) {
				return true
			}
			seen[k.Str] = true
			if n > 0 {
				b = append(b, ',')
			}
			n++
			b = appendJSONString(b, k.Str)
			b = append(b, ':')
			b = g.value(b, v, depth+1)
			return true
		})
	}
	// Required names without a property schema, and minProperties, are filled from
	// additionalProperties (anything, unless it is false).
	extra := parts[0].Get("additionalProperties")
	fill := func(name string) {
		if n > 0 {
			b = append(b, ',')
		}
		n++
		seen[name] = true
		b = appendJSONString(b, name)
		b = append(b, ':')
		if extra.IsObject() {
			b = g.value(b, extra, depth+1)
		} else {
			b = append(b, `"value"`...)
		}
	}
	for _, p := range parts {
		for _, r := range p.Get("required").Array() {
			if !seen[r.Str] {
				fill(r.Str)
			}
		}
	}
	if extra.Type != gjson.False {
		for i := 1; n < int(parts[0].Get("minProperties").Int()) && i < 1000; i++ {
			if name := "property" + strconv.Itoa(i); !seen[name] {
				fill(name)
			}
		}
	}
	return append(b, '}')
}

func (g *schemaGen) array(b []byte, s gjson.Result, depth int) []byte {
	prefix := s.Get("prefixItems").Array()
	items := s.Get("items")
	minItems, maxItems := int(s.Get("minItems").Int()), -1
	if m := s.Get("maxItems"); m.Exists() {
		maxItems = int(m.Int())
	}
	count := 2
	if depth >= maxSchemaDepth {
		count = 0
	}
	if len(prefix) > 0 {
		count = len(prefix)
		if items.Type == gjson.False {
			maxItems = min(maxItems, len(prefix))
			if maxItems < 0 {
				maxItems = len(prefix)
			}
		}
	}
	count = max(count, minItems)
	if maxItems >= 0 {
		count = min(count, maxItems)
	}
	count = min(count, 1000)
	unique := s.Get("uniqueItems").Type == gjson.True
	b = append(b, '[')
	var made []string
	for i := 0; i < count; i++ {
		if i > 0 {
			b = append(b, ',')
		}
		item := items
		if i < len(prefix) {
			item = prefix[i]
		}
		start := len(b)
		b = g.value(b, item, depth+1)
		// uniqueItems: retry for a value not seen yet, which random choices from an
		// enum or of booleans need.
		for try := 0; unique && try < 64 && contains(made, string(b[start:])); try++ {
			b = g.value(b[:start], item, depth+1)
		}
		made = append(made, string(b[start:]))
	}
	return append(b, ']')
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// formatValues are valid examples of the string formats clients ask for.
var formatValues = map[string]string{
	"date-time": "2024-05-17T09:30:00Z",
	"date":      "2024-05-17",
	"time":      "09:30:00Z",
	"duration":  "P3D",
	"email":     "ada@example.com",
	"hostname":  "example.com",
	"ipv4":      "192.0.2.1",
	"ipv6":      "2001:db8::1",
	"uri":       "https://example.com/page",
	"url":       "https://example.com/page",
	"uuid":      "3f2b8c1e-7a4d-4e9b-9c0a-5d6e7f8a9b0c",
}

func (g *schemaGen) str(b []byte, s gjson.Result) []byte {
	if v, ok := formatValues[s.Get("format").Str]; ok {
		return appendJSONString(b, v)
	}
	if p := s.Get("pattern"); p.Type == gjson.String {
		if v, ok := genRegex(p.Str, g.r); ok {
			return appendJSONString(b, v)
		}
	}
	minLen, maxLen := int(s.Get("minLength").Int()), -1
	if m := s.Get("maxLength"); m.Exists() {
		maxLen = int(m.Int())
	}
	v := seededWords[g.r.intn(len(seededWords))] + " " + seededWords[g.r.intn(len(seededWords))]
	for utf8.RuneCountInString(v) < minLen {
		v += " " + seededWords[g.r.intn(len(seededWords))]
	}
	if maxLen >= 0 && len(v) > maxLen {
		v = strings.TrimRight(v[:maxLen], " ")
		for utf8.RuneCountInString(v) < minLen {
			v += "x"
		}
	}
	return appendJSONString(b, v)
}

// bounds returns the inclusive range a number may take, from minimum, maximum and the
// exclusive bounds (numbers in draft 6+, booleans in draft 4), widened to defaults.
func bounds(s gjson.Result, step float64) (lo, hi float64) {
	lo, hi = 0, 100
	loSet, hiSet := false, false
	if m := s.Get("minimum"); m.Type == gjson.Number {
		lo, loSet = m.Num, true
	}
	if m := s.Get("maximum"); m.Type == gjson.Number {
		hi, hiSet = m.Num, true
	}
	if m := s.Get("exclusiveMinimum"); m.Type == gjson.Number {
		lo, loSet = m.Num+step, true
	} else if m.Type == gjson.True && loSet {
		lo += step
	}
	if m := s.Get("exclusiveMaximum"); m.Type == gjson.Number {
		hi, hiSet = m.Num-step, true
	} else if m.Type == gjson.True && hiSet {
		hi -= step
	}
	switch {
	case loSet && !hiSet:
		hi = lo + 100
	case hiSet && !loSet:
		lo = min(0, hi-100)
		if hi >= 0 {
			lo = 0
		}
	}
	// A wide range (zod writes ±2^53-1 for every .int()) gives friendly values: up to 100 from
	// zero, or from the lower bound when zero is out of range.
	if hi-lo > 1000 {
		lo = math.Min(math.Max(0, lo), hi)
		hi = math.Min(hi, lo+100)
	}
	return lo, hi
}

func (g *schemaGen) integer(b []byte, s gjson.Result) []byte {
	lo, hi := bounds(s, 1)
	ilo, ihi := int64(math.Ceil(lo)), int64(math.Floor(hi))
	if ihi < ilo {
		ihi = ilo
	}
	v := ilo + int64(g.r.next()%uint64(ihi-ilo+1))
	if m := s.Get("multipleOf"); m.Type == gjson.Number && m.Num >= 1 && m.Num == math.Trunc(m.Num) {
		step := int64(m.Num)
		if w := (v / step) * step; w >= ilo {
			v = w
		} else {
			v = w + step
		}
	}
	return strconv.AppendInt(b, v, 10)
}

func (g *schemaGen) number(b []byte, s gjson.Result) []byte {
	lo, hi := bounds(s, 0.01)
	if m := s.Get("multipleOf"); m.Type == gjson.Number && m.Num > 0 {
		k := math.Ceil(lo / m.Num)
		return appendFloat(b, k*m.Num)
	}
	if hi < lo {
		hi = lo
	}
	// Two decimals, inside the bounds.
	v := lo + float64(g.r.intn(1000))/1000*(hi-lo)
	v = math.Round(v*100) / 100
	v = math.Min(math.Max(v, lo), hi)
	return appendFloat(b, v)
}

// genRegex returns a short string that matches pattern, checked by Go's regexp, or false when
// the pattern is beyond this generator (or Go's syntax).
func genRegex(pattern string, r *rng) (string, bool) {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return "", false
	}
	var sb strings.Builder
	genRegexNode(&sb, re.Simplify(), r, 0)
	out := sb.String()
	full, err := regexp.Compile(`^(?:` + pattern + `)$`)
	if err != nil || !full.MatchString(out) {
		// JSON Schema patterns are unanchored: anything containing a match is valid.
		partial, err := regexp.Compile(pattern)
		if err != nil || !partial.MatchString(out) {
			return "", false
		}
	}
	return out, true
}

func genRegexNode(sb *strings.Builder, re *syntax.Regexp, r *rng, depth int) {
	if depth > 100 || sb.Len() > 4096 {
		return
	}
	switch re.Op {
	case syntax.OpLiteral:
		for _, c := range re.Rune {
			sb.WriteRune(c)
		}
	case syntax.OpCharClass:
		sb.WriteRune(pickFromClass(re.Rune, r))
	case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		sb.WriteByte('a' + byte(r.intn(26)))
	case syntax.OpCapture:
		genRegexNode(sb, re.Sub[0], r, depth+1)
	case syntax.OpConcat:
		for _, sub := range re.Sub {
			genRegexNode(sb, sub, r, depth+1)
		}
	case syntax.OpAlternate:
		genRegexNode(sb, re.Sub[r.intn(len(re.Sub))], r, depth+1)
	case syntax.OpStar, syntax.OpQuest:
		if r.intn(2) == 0 {
			genRegexNode(sb, re.Sub[0], r, depth+1)
		}
	case syntax.OpPlus:
		for i := 1 + r.intn(3); i > 0; i-- {
			genRegexNode(sb, re.Sub[0], r, depth+1)
		}
	case syntax.OpRepeat:
		n := re.Min
		if re.Max > re.Min {
			n += r.intn(min(re.Max-re.Min, 3) + 1)
		} else if re.Max < 0 {
			n += r.intn(3)
		}
		for ; n > 0; n-- {
			genRegexNode(sb, re.Sub[0], r, depth+1)
		}
	}
	// Anchors, word boundaries and empty matches generate nothing.
}

// pickFromClass picks a rune from a character class (pairs of inclusive ranges), preferring
// letters and digits so that the value reads naturally.
func pickFromClass(ranges []rune, r *rng) rune {
	if len(ranges) == 0 {
		return 'a'
	}
	for _, pref := range [][2]rune{{'a', 'z'}, {'A', 'Z'}, {'0', '9'}} {
		for i := 0; i+1 < len(ranges); i += 2 {
			lo, hi := max(ranges[i], pref[0]), min(ranges[i+1], pref[1])
			if lo <= hi {
				return lo + rune(r.intn(int(hi-lo)+1))
			}
		}
	}
	lo, hi := ranges[0], ranges[1]
	if lo < ' ' && hi >= ' ' {
		lo = ' '
	}
	if hi > lo+64 {
		hi = lo + 64
	}
	return lo + rune(r.intn(int(hi-lo)+1))
}
