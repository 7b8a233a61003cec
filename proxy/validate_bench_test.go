package proxy

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
	var req ChatRequest
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
	var req ChatRequest
	allocs := testing.AllocsPerRun(200, func() {
		if err := ValidateChat(typicalChatBody, &req); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("ValidateChat allocated %v times per run on a valid typical body, want 0", allocs)
	}
}
