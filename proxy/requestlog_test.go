package proxy

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/internal/logline"
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

// lineSink keeps the lines written to it.
type lineSink struct{ bytes.Buffer }

func (*lineSink) Sync() error { return nil }

// randomLogString is a short string of the bytes zap's JSON encoder treats
// specially, and of plain ones.
func randomLogString(r *rand.Rand) string {
	pieces := []string{"a", "Z", "0", "-", " ", "~", "\x7f", `"`, `\`, "\n", "\r", "\t", "\x00", "\x1f",
		"é", "☃", "🦫", "\u2028", "\xff", "\xc3", "\xed\xa0\x80", "0193b2f0-7c1e-7a3b-9a51-3f0c2d9e8b71"}
	b := make([]byte, 0, 64)
	for range r.IntN(8) {
		b = append(b, pieces[r.IntN(len(pieces))]...)
	}
	return string(b)
}

// TestRequestLogFastLine compares the line logline's JSON core writes for
// requestLog with the line zap writes for the request's zap.Fields, for
// records of hostile strings, extreme numbers and zones other than UTC.
func TestRequestLogFastLine(t *testing.T) {
	started := time.Date(2026, 1, 2, 3, 4, 5, 678000000, time.UTC)
	recs := []accounting.Record{
		{RequestID: "req-1", Endpoint: "chat", Model: "demo", Backend: "sim", Status: 200, Started: started,
			Ended: started.Add(1234567 * time.Microsecond), KeyName: "k", Team: "t", Project: "p", Stream: true,
			PromptTokens: 12, CompletionTokens: 34},
		{RequestID: `quote " and \ and é`, Status: 502, Started: started, Ended: started, Error: "Backend sim failed\n(EOF)"},
		{},
		{RequestID: "\x00\x1f\x7f\xff", Model: "☃🦫", Status: -1, Started: started, Ended: started.Add(-time.Millisecond),
			PromptTokens: math.MaxInt64, CompletionTokens: math.MinInt64},
		{Started: started, Ended: started.AddDate(1, 0, 0), PromptTokens: 1 << 40},
	}
	r := rand.New(rand.NewPCG(11, 12))
	for range 1000 {
		recs = append(recs, accounting.Record{RequestID: randomLogString(r), Endpoint: randomLogString(r), Model: randomLogString(r),
			Backend: randomLogString(r), Status: r.IntN(600), Started: started,
			Ended: started.Add(time.Duration(r.Int64N(1<<r.IntN(62)) - r.Int64N(1000))), KeyName: randomLogString(r),
			Team: randomLogString(r), Project: randomLogString(r), Stream: r.IntN(2) == 0,
			PromptTokens: r.Int64N(1 << r.IntN(63)), CompletionTokens: r.Int64() - r.Int64(), Error: randomLogString(r)})
	}
	zones := []*time.Location{time.UTC, time.Local, time.FixedZone("IST", 5*3600+30*60), time.FixedZone("NST", -(3*3600 + 30*60))}
	for i, rec := range recs {
		now := time.Unix(1767323045+int64(i)*7919, int64(i)*104729).In(zones[i%len(zones)])
		ent := zapcore.Entry{Level: zap.InfoLevel, Time: now, Message: "request"}
		var fast, plain lineSink
		if err := logline.NewJSONCore(&fast, zap.InfoLevel).Write(ent, []zap.Field{zap.Inline(requestLog{&rec})}); err != nil {
			t.Fatal(err)
		}
		core := zapcore.NewCore(zapcore.NewJSONEncoder(logline.EncoderConfig()), &plain, zap.InfoLevel)
		if err := core.Write(ent, requestLogFields(&rec)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fast.Bytes(), plain.Bytes()) {
			t.Fatalf("record %d: line\n%s\nzap writes\n%s", i, fast.Bytes(), plain.Bytes())
		}
	}
}

// BenchmarkRequestLog is the request line through a JSON core writing to
// nothing: as zap.Fields and as requestLog through zap's core, and as
// requestLog through logline's.
func BenchmarkRequestLog(b *testing.B) {
	cfg := logline.EncoderConfig()
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(cfg), zapcore.AddSync(discardWriter{}), zap.InfoLevel))
	fast := zap.New(logline.NewJSONCore(zapcore.AddSync(discardWriter{}), zap.InfoLevel))
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
	b.Run("logline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if ce := fast.Check(zap.InfoLevel, "request"); ce != nil {
				ce.Write(zap.Inline(requestLog{&rec}))
			}
		}
	})
}

type discardWriter struct{}

func (discardWriter) Write(p []byte) (int, error) { return len(p), nil }
