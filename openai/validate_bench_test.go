package openai

import "testing"

// typicalChatBody is a realistic chat request of about 1 KiB: a system prompt, a short
// exchange and a follow-up question, with the newlines and quotes real prompts carry
// (escapes matter: they are what makes gjson's ForEach allocate), plus the fields most
// clients send.
var typicalChatBody = []byte(`{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[` +
	`{"role":"system","content":"You are the assistant of an online bookshop.\nAnswer briefly, give the catalogue number whenever you mention a book, and never invent prices or stock levels.\nIf you do not know something, say so and offer to ask a bookseller."},` +
	`{"role":"user","content":"Hi! I'm looking for a novel set in Lisbon, ideally published in the last twenty years. My book club loved \"Night Train to Lisbon\" and wants something similar, but shorter: we meet every three weeks."},` +
	`{"role":"assistant","content":"Two good fits:\n1. \"The Lisbon Crossing\" (catalogue 4471), 240 pages, 2011, a quiet story of exile and return.\n2. \"A Small Death in Lisbon\" (catalogue 3310), 2000, a little longer but a real page-turner.\nWould you like a short summary of either?"},` +
	`{"role":"user","content":"Yes please, a summary of the first one, and is it available in paperback?"}],` +
	`"temperature":0.7,"max_tokens":512,"stream":true,"stream_options":{"include_usage":true}}`)

func BenchmarkValidateChat(b *testing.B) {
	var req Request
	b.ReportAllocs()
	b.SetBytes(int64(len(typicalChatBody)))
	for b.Loop() {
		if err := ValidateChat(typicalChatBody, &req); err != nil {
			b.Fatal(err)
		}
	}
}

// TestValidateChatZeroAllocs holds the hot path to its promise: a valid typical body is
// checked without a single allocation.
func TestValidateChatZeroAllocs(t *testing.T) {
	var req Request
	allocs := testing.AllocsPerRun(200, func() {
		if err := ValidateChat(typicalChatBody, &req); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("ValidateChat allocated %v times per run on a valid typical body, want 0", allocs)
	}
}

// toolChatBody is an agent's turn as the AI SDK and the OpenAI SDK send it: tools with
// strict JSON Schemas, a named tool choice, an earlier tool call and its result, and the
// structured-output, stop and bias fields that ride along.
var toolChatBody = []byte(`{"model":"demo","messages":[` +
	`{"role":"system","content":"You answer questions about the weather.\nCall a tool when you need data."},` +
	`{"role":"user","content":"What is the weather in Paris, and should I take an umbrella?"},` +
	`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"unit\":\"celsius\"}"}}]},` +
	`{"role":"tool","tool_call_id":"call_1","content":"{\"temperature\":18,\"rain\":0.7}"},` +
	`{"role":"user","content":"And in Lisbon?"}],` +
	`"tools":[{"type":"function","function":{"name":"get_weather","description":"Current weather of a city","strict":true,` +
	`"parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["city","unit"],"additionalProperties":false}}},` +
	`{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{}}}}],` +
	`"tool_choice":{"type":"function","function":{"name":"get_weather"}},"parallel_tool_calls":false,` +
	`"response_format":{"type":"json_schema","json_schema":{"name":"answer","strict":true,"schema":{"type":"object"}}},` +
	`"stop":["\n\nUser:"],"logit_bias":{"50256":-100},"temperature":0,"max_tokens":256.0,"min_tokens":1,` +
	`"stream":true,"stream_options":{"include_usage":true}}`)

func BenchmarkValidateChatTools(b *testing.B) {
	var req Request
	b.ReportAllocs()
	b.SetBytes(int64(len(toolChatBody)))
	for b.Loop() {
		if err := ValidateChat(toolChatBody, &req); err != nil {
			b.Fatal(err)
		}
	}
}

// TestValidateChatToolsZeroAllocs holds tool-calling bodies to the same promise.
func TestValidateChatToolsZeroAllocs(t *testing.T) {
	var req Request
	allocs := testing.AllocsPerRun(200, func() {
		if err := ValidateChat(toolChatBody, &req); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("ValidateChat allocated %v times per run on a valid tool-calling body, want 0", allocs)
	}
	if req.ToolChoice != ToolChoiceNamed || string(req.ToolChoiceName) != "get_weather" || req.MaxTokens != 256 {
		t.Fatalf("ToolChoice %v %q MaxTokens %d", req.ToolChoice, req.ToolChoiceName, req.MaxTokens)
	}
}
