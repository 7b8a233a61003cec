package openai

import (
	"testing"

	"github.com/tidwall/gjson"
)

// chunkSeeds are chunks as backends send them, and the shapes that take the
// flat read off its path.
var chunkSeeds = []string{
	`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1795833173,"model":"demo","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
	`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1795833173,"model":"demo","choices":[{"index":0,"delta":{"content":"tok0 "},"logprobs":null,"finish_reason":null}]}`,
	`{"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`,
	`{"id":"c","choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`,
	`{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\""}}]}}]}`,
	`{"id":"c","choices":[{"delta":{"reasoning_content":"hm"}},{"delta":{"function_call":null}},{"text":"x"},{"text":""},7,"s",null,[1]]}`,
	`{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" hi","logprobs":null}]}`,
	`{"error":{"message":"overloaded","type":"server_error"}}`,
	`{"error":"boom"}`,
	`{"choices":[{"delta":{"content":"a"},"delta":{"content":""}}],"choices":[{"text":"b","text":""}]}`,
	`{"id":null,"id":"late","created":0,"created":"17","model":7,"model":"m"}`,
	`{"choices":{"a":{"delta":{"content":"x"}}}}`,
	`{"choices":null,"usage":null}`,
	`{"ch\u006fices":[{"delta":{"content":"x"}}]}`,
	`{"choices":[{"d\u0065lta":{"content":"x"}}]}`,
	`{"choices":[{"delta":{"c\u006fntent":"x"}}]}`,
	`{"choices":[{"delta":{"content":"x"}}]} trailing`,
	`{"choices":[{"delta":{"content":"x"}]}`,
	`  {"choices":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}  `,
	`[1,2]`,
	``,
	`{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop","finish_reason":"length"},{"finish_reason":"l\u0065ngth"},{"finish_reason":7},{"finish_reason":"eos"}]}`,
}

// TestReadFlatTakesBackendChunks checks that the chunks backends send are
// read by the flat scan (its stack stays within 4 KiB, see chunk_choices.go),
// not left to gjson, and read right.
func TestReadFlatTakesBackendChunks(t *testing.T) {
	tests := []struct {
		name                  string
		chunk                 string
		deltas                int64
		nonEmpty, usage, fail bool
	}{
		{"role chunk", chunkSeeds[0], 0, true, false, false},
		{"content chunk", chunkSeeds[1], 1, true, false, false},
		{"usage chunk", chunkSeeds[2], 0, false, true, false},
		{"continuous usage", chunkSeeds[3], 1, true, true, false},
		{"tool call", chunkSeeds[4], 1, true, false, false},
		{"mixed choices", chunkSeeds[5], 2, true, false, false},
		{"text completion", chunkSeeds[6], 1, true, false, false},
		{"escaped key", chunkSeeds[13], 0, false, false, true},
		{"trailing bytes", chunkSeeds[16], 0, false, false, true},
		{"invalid", chunkSeeds[17], 0, false, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := chunkFields{modelStart: -1, usageKey: -1}
			if ok := f.readFlat(tt.chunk, true); ok == tt.fail {
				t.Fatalf("readFlat ok = %v, want %v", ok, !tt.fail)
			}
			if tt.fail {
				return
			}
			if f.deltas != tt.deltas || f.nonEmptyChoices != tt.nonEmpty || f.usage.Exists() != tt.usage {
				t.Errorf("deltas %d, choices with elements %v, usage %v; want %d, %v, %v",
					f.deltas, f.nonEmptyChoices, f.usage.Exists(), tt.deltas, tt.nonEmpty, tt.usage)
			}
		})
	}
}

// FuzzChunkFields checks that wherever the flat read of a chunk succeeds,
// it reads what the gjson walk reads.
func FuzzChunkFields(f *testing.F) {
	for _, s := range chunkSeeds {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, s string, wantID bool) {
		flat := chunkFields{modelStart: -1, usageKey: -1}
		if !flat.readFlat(s, wantID) {
			return
		}
		walked := chunkFields{modelStart: -1, usageKey: -1}
		walked.readGJSON(s, wantID)
		if !sameChunkFields(flat, walked) {
			t.Fatalf("chunk %q (want id %v):\nflat   %+v\ngjson  %+v", s, wantID, flat, walked)
		}
		// Process reads a usage the flat read checked as it reads the
		// walk's: the same counts, or the same refusal.
		if flat.usage.Exists() && flat.usage.Type != gjson.Null {
			var fromFlat, fromWalk UsageCounts
			flatErr, walkErr := fromFlat.setChat(flat.usage, flat.usageChecked), fromWalk.setChat(walked.usage, walked.usageChecked)
			if fromFlat != fromWalk || (flatErr == nil) != (walkErr == nil) {
				t.Fatalf("chunk %q: usage %+v (%v) from the flat read, %+v (%v) from the walk", s, fromFlat, flatErr, fromWalk, walkErr)
			}
		}
	})
}

func sameChunkFields(a, b chunkFields) bool {
	sameUsage := func(x, y gjson.Result) bool {
		return x.Type == y.Type && x.Raw == y.Raw && x.Str == y.Str && x.Num == y.Num && (!x.Exists() || x.Index == y.Index)
	}
	return a.modelStart == b.modelStart && (a.modelStart < 0 || a.modelEnd == b.modelEnd) &&
		sameUsage(a.usage, b.usage) && a.usageKey == b.usageKey &&
		a.hasChoices == b.hasChoices && a.nonEmptyChoices == b.nonEmptyChoices && a.deltas == b.deltas &&
		a.id == b.id && a.created == b.created && a.hasError == b.hasError && a.errMessage == b.errMessage &&
		a.finish == b.finish
}
