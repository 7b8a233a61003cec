package proxy

import (
	"bytes"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tollgate-dev/tollgate/accounting"
)

// requestLogFields is the request line as zap.Fields, the way it was
// written before requestLog: the reference its output must match.
func requestLogFields(r *accounting.Record) []zap.Field {
	return []zap.Field{
		zap.String("request_id", r.RequestID),
		zap.String("endpoint", r.Endpoint),
		zap.String("model", r.Model),
		zap.String("backend", r.Backend),
		zap.Int("status", r.Status),
		zap.Duration("duration", r.Ended.Sub(r.Started)),
		zap.String("key", r.KeyName),
		zap.String("team", r.Team),
		zap.String("project", r.Project),
		zap.Bool("stream", r.Stream),
		zap.Int64("prompt_tokens", r.PromptTokens),
		zap.Int64("completion_tokens", r.CompletionTokens),
		zap.String("error", r.Error),
	}
}

// logEncoders are the encoders cmd/tollgate logs with: JSON and console,
// on the production encoder config with ISO 8601 times.
func logEncoders() map[string]zapcore.Encoder {
	cfg := zap.NewProductionEncoderConfig()
	cfg.EncodeTime = zapcore.ISO8601TimeEncoder
	return map[string]zapcore.Encoder{"json": zapcore.NewJSONEncoder(cfg), "console": zapcore.NewConsoleEncoder(cfg)}
}

func TestRequestLogLine(t *testing.T) {
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, rec := range []accounting.Record{
		{RequestID: "req-1", Endpoint: "chat", Model: "demo", Backend: "sim", Status: 200, Started: started,
			Ended: started.Add(1234567 * time.Microsecond), KeyName: "k", Team: "t", Project: "p", Stream: true,
			PromptTokens: 12, CompletionTokens: 34},
		{RequestID: `quote " and \ and é`, Status: 502, Started: started, Ended: started, Error: "Backend sim failed\n(EOF)"},
		{},
	} {
		for name, enc := range logEncoders() {
			t.Run(name+"/"+rec.RequestID, func(t *testing.T) {
				entry := zapcore.Entry{Level: zap.InfoLevel, Time: started, Message: "request"}
				want, err := enc.Clone().EncodeEntry(entry, requestLogFields(&rec))
				if err != nil {
					t.Fatal(err)
				}
				got, err := enc.Clone().EncodeEntry(entry, []zap.Field{zap.Inline(requestLog{&rec})})
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got.Bytes(), want.Bytes()) {
					t.Errorf("line\n%s\nwant\n%s", got.Bytes(), want.Bytes())
				}
			})
		}
	}
}

// BenchmarkRequestLog is the request line through a JSON core writing to
// nothing: as zap.Fields, and as requestLog.
func BenchmarkRequestLog(b *testing.B) {
	cfg := zap.NewProductionEncoderConfig()
	cfg.EncodeTime = zapcore.ISO8601TimeEncoder
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(cfg), zapcore.AddSync(discardWriter{}), zap.InfoLevel))
	now := time.Now()
	rec := accounting.Record{RequestID: "0193b2f0-7c1e-7a3b-9a51-3f0c2d9e8b71", Endpoint: "chat", Model: "demo", Backend: "sim",
		Status: 200, Started: now, Ended: now.Add(3 * time.Millisecond), KeyName: "bench", Team: "bench", Project: "default",
		PromptTokens: 60, CompletionTokens: 16}
	b.Run("fields", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if ce := log.Check(zap.InfoLevel, "request"); ce != nil {
				ce.Write(requestLogFields(&rec)...)
			}
		}
	})
	b.Run("inline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if ce := log.Check(zap.InfoLevel, "request"); ce != nil {
				ce.Write(zap.Inline(requestLog{&rec}))
			}
		}
	})
}

type discardWriter struct{}

func (discardWriter) Write(p []byte) (int, error) { return len(p), nil }
