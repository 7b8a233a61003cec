package proxy

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/backends"
)

func TestParseUsage(t *testing.T) {
	tests := []struct {
		name  string
		usage string
		// want is prompt, completion, total, cached; wantErr the field
		// named in the error ("" for no error).
		want    [4]int64
		wantErr string
	}{
		{"vllm", `{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}`, [4]int64{10, 5, 15, 0}, ""},
		{"cached", `{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":8}}`, [4]int64{10, 5, 15, 8}, ""},
		{"null details", `{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":null}`, [4]int64{10, 5, 15, 0}, ""},
		{"no total", `{"prompt_tokens":10,"completion_tokens":5}`, [4]int64{10, 5, 15, 0}, ""},
		{"zero total", `{"prompt_tokens":10,"completion_tokens":5,"total_tokens":0}`, [4]int64{10, 5, 15, 0}, ""},
		{"total above the parts", `{"prompt_tokens":10,"completion_tokens":5,"total_tokens":20}`, [4]int64{10, 5, 20, 0}, ""},
		{"at the bound", `{"prompt_tokens":1099511627776,"completion_tokens":0}`, [4]int64{1 << 40, 0, 1 << 40, 0}, ""},
		{"over the bound", `{"prompt_tokens":1099511627777,"completion_tokens":0}`, [4]int64{}, "usage.prompt_tokens exceeds"},
		{"int64 max", `{"prompt_tokens":9223372036854775807}`, [4]int64{}, "usage.prompt_tokens exceeds"},
		{"past int64", `{"completion_tokens":99999999999999999999999}`, [4]int64{}, "usage.completion_tokens exceeds"},
		{"negative", `{"prompt_tokens":10,"completion_tokens":-1}`, [4]int64{}, "usage.completion_tokens is negative"},
		{"negative zero", `{"prompt_tokens":-0}`, [4]int64{}, "usage.prompt_tokens is negative"},
		{"exponent", `{"prompt_tokens":1e300}`, [4]int64{}, "usage.prompt_tokens is not an integer"},
		{"small exponent", `{"prompt_tokens":1e2}`, [4]int64{}, "usage.prompt_tokens is not an integer"},
		{"fraction", `{"prompt_tokens":10.5}`, [4]int64{}, "usage.prompt_tokens is not an integer"},
		{"string", `{"prompt_tokens":"10"}`, [4]int64{}, "usage.prompt_tokens is not a number"},
		{"bool", `{"total_tokens":true}`, [4]int64{}, "usage.total_tokens is not a number"},
		{"object", `{"prompt_tokens":{}}`, [4]int64{}, "usage.prompt_tokens is not a number"},
		{"total below the parts", `{"prompt_tokens":10,"completion_tokens":5,"total_tokens":3}`, [4]int64{}, "usage.total_tokens (3) is less than"},
		{"cached above the prompt", `{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":11}}`, [4]int64{}, "cached_tokens (11) exceeds"},
		{"not an object", `"lots"`, [4]int64{}, "usage is not an object"},
		{"array", `[1,2]`, [4]int64{}, "usage is not an object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// u starts with an earlier valid report, which a refused one
			// must leave in place.
			u := usageCounts{prompt: 1, completion: 2, total: 3, reported: true}
			err := u.parseUsage(gjson.Parse(tt.usage), &chatUsageFields)
			if tt.wantErr != "" {
				var ue *usageError
				if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want a usageError containing %q", err, tt.wantErr)
				}
				if u != (usageCounts{prompt: 1, completion: 2, total: 3, reported: true}) {
					t.Errorf("a refused usage changed the counts: %+v", u)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := [4]int64{u.prompt, u.completion, u.total, u.cached}; got != tt.want || !u.reported {
				t.Errorf("counts %v (reported %v), want %v", got, u.reported, tt.want)
			}
		})
	}
	t.Run("absent or null is no report", func(t *testing.T) {
		for _, v := range []gjson.Result{{}, gjson.Parse(`null`)} {
			var u usageCounts
			if err := u.parseUsage(v, &chatUsageFields); err != nil || u.reported {
				t.Errorf("%q: err %v, reported %v", v.Raw, err, u.reported)
			}
		}
	})
}

// panicReader is an upstream body whose Read panics, as a bug met by
// hostile bytes would.
type panicReader struct{}

func (panicReader) Read([]byte) (int, error) { panic("hostile bytes") }

// TestStreamReadRecovers makes the stream body's upstream read panic: Read
// must answer an in-band error and [DONE], then EOF, count the panic, and
// not let it reach fasthttp's worker, which would end the process.
func TestStreamReadRecovers(t *testing.T) {
	s := &Server{metrics: newMetrics(nil), log: zap.NewNop()}
	sb := &streamBody{srv: s, backend: &backends.Backend{Name: "b"}}
	sb.c.rec.Started = time.Now()
	sb.scan.reset(panicReader{})
	buf := make([]byte, 4096)
	n, err := sb.Read(buf)
	if err != nil || n == 0 {
		t.Fatalf("Read = %d, %v; want the in-band error", n, err)
	}
	got := string(buf[:n])
	if !strings.Contains(got, `"code":"internal_error"`) || !strings.HasSuffix(got, "data: [DONE]\n\n") {
		t.Errorf("events after the panic: %q", got)
	}
	if n, err := sb.Read(buf); n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("second Read = %d, %v; want EOF", n, err)
	}
	if c := testutil.ToFloat64(s.metrics.panics.WithLabelValues("stream")); c != 1 {
		t.Errorf("panics counted: %v, want 1", c)
	}
}

// TestClientWatchSleep checks that a backoff ends with shutdown and with
// the client, and runs its course otherwise.
func TestClientWatchSleep(t *testing.T) {
	w := &clientWatch{gone: make(chan struct{})}
	if !w.sleep(time.Millisecond, nil) {
		t.Error("a short sleep did not run its course")
	}
	shutdown := make(chan struct{})
	close(shutdown)
	if w.sleep(time.Hour, shutdown) {
		t.Error("a sleep went on through shutdown")
	}
	if e := w.waitError(); e.Status != 503 || e.Code != "shutting_down" {
		t.Errorf("shutdown error = %+v", e)
	}
	close(w.gone)
	if w.sleep(time.Hour, nil) {
		t.Error("a sleep went on after the client left")
	}
	if e := w.waitError(); e.Status != statusClientClosed {
		t.Errorf("client-gone error = %+v", e)
	}
}
