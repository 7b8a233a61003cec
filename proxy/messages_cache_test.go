package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// TestMessagesCacheWrites records the prompt tokens a native backend
// reports written to its prompt cache (cache_creation_input_tokens) as the
// record's cache writes, in the prompt with the cache reads, from a reply
// and from a stream.
func TestMessagesCacheWrites(t *testing.T) {
	const usage = `"usage":{"input_tokens":10,"cache_creation_input_tokens":50,"cache_read_input_tokens":30,"output_tokens":5}`
	h, _ := newMessagesHarnessWith(t, "native", "  - name: claude\n    backends: [sim]\n", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !gjson.GetBytes(body, "stream").Bool() {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"id":"msg_c1","type":"message","role":"assistant","model":"claude","content":[{"type":"text","text":"Hi"}],` +
				`"stop_reason":"end_turn","stop_sequence":null,` + usage + `}`))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte(strings.Join([]string{
			`event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"msg_c2","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":null,"stop_sequence":null,` +
				`"usage":{"input_tokens":10,"cache_creation_input_tokens":50,"cache_read_input_tokens":30,"output_tokens":1}}}`,
			`event: content_block_start` + "\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
			`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`,
			`event: content_block_stop` + "\n" + `data: {"type":"content_block_stop","index":0}`,
			`event: message_delta` + "\n" + `data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},` + usage + `}`,
			`event: message_stop` + "\n" + `data: {"type":"message_stop"}`,
		}, "\n\n") + "\n\n"))
	})
	const ask = `{"model":"claude","max_tokens":50,"messages":[{"role":"user","content":"Hello"}]}`
	for i, body := range []string{ask, strings.Replace(ask, `"max_tokens":50,`, `"max_tokens":50,"stream":true,`, 1)} {
		r := h.messages("", body)
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		rec := h.recorder.wait(t, i+1)
		if rec.PromptTokens != 90 || rec.CachedTokens != 30 || rec.CacheWriteTokens != 50 || rec.CompletionTokens != 5 || rec.TotalTokens != 95 {
			t.Errorf("stream %v: prompt %d, cached %d, cache writes %d, completion %d, total %d; want 90, 30, 50, 5, 95",
				i == 1, rec.PromptTokens, rec.CachedTokens, rec.CacheWriteTokens, rec.CompletionTokens, rec.TotalTokens)
		}
	}
}
