package simulated

import (
	"strconv"
	"time"

	"github.com/tidwall/gjson"
)

// sampling holds the request fields that shape generated text, shared by chat and text
// completions: seed, stop strings and token ids, and structured outputs.
type sampling struct {
	seed    int64
	hasSeed bool
	stops   stopRules
	format  outputFormat
	// minTokens is vLLM's min_tokens: no stop string or stop token ends a choice before it,
	// and the simulated model does not stop by itself before it either.
	minTokens int
}

// Kinds of structured output.
const (
	formatText = iota
	formatJSONObject
	formatJSONSchema
	formatChoice
	formatRegex
)

// outputFormat is what response_format or structured_outputs asks the text to be.
type outputFormat struct {
	kind    int
	schema  gjson.Result   // formatJSONSchema
	choices []gjson.Result // formatChoice: strings
	regex   string         // formatRegex
}

// genericObjectSchema is what json_object mode generates: any JSON object will do, so one that
// reads like an answer.
var genericObjectSchema = gjson.Parse(`{"type":"object","properties":{"answer":{"type":"string"},"confidence":{"type":"number","minimum":0,"maximum":1}},"required":["answer","confidence"]}`)

// field parses one top-level field if it is a sampling field, reporting whether it was one.
func (sp *sampling) field(key string, v gjson.Result) (bool, apiError) {
	if v.Type == gjson.Null {
		switch key {
		case "seed", "stop", "stop_token_ids", "min_tokens", "include_stop_str_in_output", "response_format",
			"structured_outputs", "guided_json", "guided_choice", "guided_regex":
			return true, apiError{}
		}
		return false, apiError{}
	}
	switch key {
	case "seed":
		if v.Type != gjson.Number || v.Num != float64(int64(v.Num)) || v.Num > 9.2e18 || v.Num < -9.2e18 {
			return true, badRequest("seed", "seed must be an integer that fits in 64 bits.")
		}
		sp.seed, sp.hasSeed = v.Int(), true
	case "stop":
		switch {
		case v.Type == gjson.String:
			if v.Str == "" {
				return true, badRequest("stop", "stop strings must not be empty.")
			}
			sp.stops.strings = append(sp.stops.strings, v.Str)
		case v.IsArray():
			for _, s := range v.Array() {
				if s.Type != gjson.String || s.Str == "" {
					return true, badRequest("stop", "stop must be a string or an array of non-empty strings.")
				}
				sp.stops.strings = append(sp.stops.strings, s.Str)
			}
		default:
			return true, badRequest("stop", "stop must be a string or an array of non-empty strings.")
		}
	case "min_tokens":
		if v.Type != gjson.Number || v.Num != float64(int(v.Num)) || v.Num < 0 || v.Num > maxModelLen {
			return true, badRequest("min_tokens", "min_tokens must be an integer from 0 to "+strconv.Itoa(maxModelLen)+".")
		}
		sp.minTokens = int(v.Num)
		sp.stops.minTokens = sp.minTokens
	case "stop_token_ids":
		if !v.IsArray() {
			return true, badRequest("stop_token_ids", "stop_token_ids must be an array of integers.")
		}
		for _, id := range v.Array() {
			if id.Type != gjson.Number || id.Num != float64(int64(id.Num)) {
				return true, badRequest("stop_token_ids", "stop_token_ids must be an array of integers.")
			}
			sp.stops.tokenIDs = append(sp.stops.tokenIDs, id.Int())
		}
	case "include_stop_str_in_output":
		if v.Type != gjson.True && v.Type != gjson.False {
			return true, badRequest(key, key+" must be a boolean.")
		}
		sp.stops.includeStr = v.Type == gjson.True
	case "response_format":
		if sp.format.kind != formatText {
			return true, apiError{} // structured_outputs came first and wins
		}
		return true, sp.responseFormat(v)
	case "structured_outputs":
		return true, sp.structuredOutputs(v)
	case "guided_json", "guided_choice", "guided_regex":
		// The names vLLM used before structured_outputs.
		return true, sp.structuredOutputs(gjson.Parse(`{"` + key[len("guided_"):] + `":` + v.Raw + `}`))
	default:
		return false, apiError{}
	}
	return true, apiError{}
}

func (sp *sampling) responseFormat(v gjson.Result) apiError {
	if !v.IsObject() {
		return badRequest("response_format", "response_format must be an object.")
	}
	switch t := v.Get("type"); t.Str {
	case "text", "structural_tag":
		// A structural tag constrains only tagged regions; plain text satisfies it.
	case "json_object":
		sp.format = outputFormat{kind: formatJSONObject}
	case "json_schema":
		js := v.Get("json_schema")
		if !js.IsObject() {
			return badRequest("response_format", "response_format of type json_schema must carry json_schema.")
		}
		schema := js.Get("schema")
		if !schema.Exists() {
			schema = js.Get("json_schema") // some clients nest it under this name
		}
		if !schema.IsObject() {
			sp.format = outputFormat{kind: formatJSONObject}
			return apiError{}
		}
		sp.format = outputFormat{kind: formatJSONSchema, schema: schema}
	default:
		return badRequest("response_format.type", "response_format.type must be one of text, json_object, json_schema, structural_tag.")
	}
	return apiError{}
}

func (sp *sampling) structuredOutputs(v gjson.Result) apiError {
	if !v.IsObject() {
		return badRequest("structured_outputs", "structured_outputs must be an object.")
	}
	set := 0
	for _, k := range []string{"json", "regex", "choice", "grammar", "json_object", "structural_tag"} {
		if x := v.Get(k); x.Exists() && x.Type != gjson.Null && x.Type != gjson.False {
			set++
		}
	}
	if set > 1 {
		return badRequest("structured_outputs", "You can only use one kind of structured outputs constraint but multiple are specified.")
	}
	switch {
	case v.Get("json").Exists() && v.Get("json").Type != gjson.Null:
		js := v.Get("json")
		if js.Type == gjson.String {
			if !gjson.Valid(js.Str) {
				return badRequest("structured_outputs.json", "structured_outputs.json must be a JSON schema.")
			}
			js = gjson.Parse(js.Str)
		}
		if !js.IsObject() {
			return badRequest("structured_outputs.json", "structured_outputs.json must be a JSON schema.")
		}
		sp.format = outputFormat{kind: formatJSONSchema, schema: js}
	case v.Get("json_object").Type == gjson.True:
		sp.format = outputFormat{kind: formatJSONObject}
	case v.Get("choice").Exists() && v.Get("choice").Type != gjson.Null:
		choices := v.Get("choice").Array()
		if len(choices) == 0 {
			return badRequest("structured_outputs.choice", "structured_outputs.choice must be a non-empty array of strings.")
		}
		for _, c := range choices {
			if c.Type != gjson.String {
				return badRequest("structured_outputs.choice", "structured_outputs.choice must be a non-empty array of strings.")
			}
		}
		sp.format = outputFormat{kind: formatChoice, choices: choices}
	case v.Get("regex").Type == gjson.String:
		if _, ok := genRegex(v.Get("regex").Str, &rng{}); !ok {
			return badRequest("structured_outputs.regex", "The simulated backend cannot generate text for this regex.")
		}
		sp.format = outputFormat{kind: formatRegex, regex: v.Get("regex").Str}
	}
	return apiError{}
}

// vary gives sp a seed of its own when Options.VariedText asks for sampled text; the request's
// own seed, parsed after, replaces it.
func (s *Server) vary(sp *sampling) {
	if s.opts.VariedText {
		sp.seed, sp.hasSeed = int64(mix(uint64(s.varied.Add(1)), uint64(time.Now().UnixNano()))), true
	}
}

// rich reports whether the request needs more than the plain counting text.
func (sp *sampling) rich() bool {
	return sp.hasSeed || !sp.stops.empty() || sp.format.kind != formatText || sp.minTokens > 0
}

// base is the seed of choice generators: the seed and the prompt together, so that the same seed
// and prompt give the same text whatever else the request changes (stop, n, max_tokens).
func (sp *sampling) base(prompt string) uint64 {
	h := fnv64(fnvOffset, prompt)
	if sp.hasSeed {
		h = mix(h, uint64(sp.seed))
	}
	return h
}

// source returns the token source of a text (not tool call) choice, drawing from r.
func (sp *sampling) source(r *rng) tokenSource {
	switch sp.format.kind {
	case formatJSONObject:
		return documentSource(genDocument(genericObjectSchema, r))
	case formatJSONSchema:
		return documentSource(genDocument(sp.format.schema, r))
	case formatChoice:
		return documentSource(sp.format.choices[r.intn(len(sp.format.choices))].Str)
	case formatRegex:
		s, _ := genRegex(sp.format.regex, r)
		return documentSource(s)
	}
	if sp.hasSeed {
		return tokenSource{kind: sourceSeeded, seeded: *r}
	}
	return tokenSource{kind: sourceCounting}
}

// document reports whether the source ends by itself (structured output) rather than at a limit.
func (sp *sampling) document() bool { return sp.format.kind != formatText }

func documentSource(doc string) tokenSource {
	return tokenSource{kind: sourceDocument, doc: splitTokens(doc)}
}

// limit returns the most tokens a choice may generate and the finish reason when it gets there:
// the request's max tokens ("length"); else, for open text, the configured completion length,
// where the simulated model stops by itself ("stop"); else, for a document, what the context
// leaves.
func (sp *sampling) limit(maxTokens, defaultTokens, prompt int) (int, string) {
	switch {
	case maxTokens > 0:
		return maxTokens, "length"
	case sp.document():
		return max(maxModelLen-prompt, 1), "length"
	}
	return max(defaultTokens, sp.minTokens), "stop"
}
