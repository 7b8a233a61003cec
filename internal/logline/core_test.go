package logline

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// testFields is a Fields of each kind of value, that declines when told to.
type testFields struct {
	s       string
	d       time.Duration
	n       int64
	b       bool
	decline bool
	none    bool // no fields at all
}

func (f testFields) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	if f.none {
		return nil
	}
	enc.AddString("s", f.s)
	enc.AddDuration("d", f.d)
	enc.AddInt64("n", f.n)
	enc.AddBool("b", f.b)
	return nil
}

func (f testFields) AppendJSONFields(dst []byte) ([]byte, bool) {
	if f.decline {
		return append(dst, "garbage"...), false
	}
	if f.none {
		return dst, true
	}
	dst = append(dst, `"s":`...)
	dst = AppendString(dst, f.s)
	dst = append(dst, `,"d":`...)
	dst = AppendSeconds(dst, f.d)
	dst = append(dst, `,"n":`...)
	dst = AppendInt(dst, f.n)
	dst = append(dst, `,"b":`...)
	return AppendBool(dst, f.b), true
}

// sink is a WriteSyncer that keeps what is written and counts the writes.
type sink struct {
	bytes.Buffer
	writes int
}

func (s *sink) Write(p []byte) (int, error) { s.writes++; return s.Buffer.Write(p) }
func (*sink) Sync() error                   { return nil }

// writeBoth writes ent with fields through the JSON core and through the
// plain zap core it stands for, returning both outputs.
func writeBoth(t *testing.T, ent zapcore.Entry, fields ...zapcore.Field) (got, want string) {
	t.Helper()
	var fast, plain sink
	if err := NewJSONCore(&fast, zapcore.DebugLevel).Write(ent, fields); err != nil {
		t.Fatal(err)
	}
	if err := zapcore.NewCore(zapcore.NewJSONEncoder(EncoderConfig()), &plain, zapcore.DebugLevel).Write(ent, fields); err != nil {
		t.Fatal(err)
	}
	if fast.writes != 1 {
		t.Errorf("%d writes for one line", fast.writes)
	}
	return fast.String(), plain.String()
}

func TestCoreMatchesZap(t *testing.T) {
	now := time.Date(2026, 3, 4, 5, 6, 7, 890123456, time.UTC)
	f := testFields{s: "gpt-4o", d: 3 * time.Millisecond, n: 60, b: true}
	tests := []struct {
		name   string
		ent    zapcore.Entry
		fields []zapcore.Field
	}{
		{"info", zapcore.Entry{Level: zapcore.InfoLevel, Time: now, Message: "request"}, []zapcore.Field{zap.Inline(f)}},
		{"debug", zapcore.Entry{Level: zapcore.DebugLevel, Time: now, Message: "request"}, []zapcore.Field{zap.Inline(f)}},
		{"warn", zapcore.Entry{Level: zapcore.WarnLevel, Time: now, Message: "request"}, []zapcore.Field{zap.Inline(f)}},
		{"error", zapcore.Entry{Level: zapcore.ErrorLevel, Time: now, Message: "request"}, []zapcore.Field{zap.Inline(f)}},
		{"dpanic", zapcore.Entry{Level: zapcore.DPanicLevel, Time: now, Message: "request"}, []zapcore.Field{zap.Inline(f)}},
		{"custom level", zapcore.Entry{Level: zapcore.Level(-3), Time: now, Message: "request"}, []zapcore.Field{zap.Inline(f)}},
		{"hostile message", zapcore.Entry{Level: zapcore.InfoLevel, Time: now, Message: "a \"b\"\n\xff"}, []zapcore.Field{zap.Inline(f)}},
		{"empty message", zapcore.Entry{Level: zapcore.InfoLevel, Time: now}, []zapcore.Field{zap.Inline(f)}},
		{"zero time", zapcore.Entry{Level: zapcore.InfoLevel, Message: "request"}, []zapcore.Field{zap.Inline(f)}},
		{"zone", zapcore.Entry{Level: zapcore.InfoLevel, Time: now.In(time.FixedZone("X", -(9*3600 + 30*60))), Message: "request"}, []zapcore.Field{zap.Inline(f)}},
		{"year 12026", zapcore.Entry{Level: zapcore.InfoLevel, Time: now.AddDate(10000, 0, 0), Message: "request"}, []zapcore.Field{zap.Inline(f)}},
		{"logger name", zapcore.Entry{Level: zapcore.InfoLevel, Time: now, Message: "request", LoggerName: "proxy"}, []zapcore.Field{zap.Inline(f)}},
		{"caller", zapcore.Entry{Level: zapcore.InfoLevel, Time: now, Message: "request", Caller: zapcore.NewEntryCaller(0, "a/b.go", 7, true)}, []zapcore.Field{zap.Inline(f)}},
		{"stack", zapcore.Entry{Level: zapcore.InfoLevel, Time: now, Message: "request", Stack: "goroutine 1"}, []zapcore.Field{zap.Inline(f)}},
		{"declined", zapcore.Entry{Level: zapcore.InfoLevel, Time: now, Message: "request"}, []zapcore.Field{zap.Inline(testFields{s: "x", decline: true})}},
		{"no fields in the object", zapcore.Entry{Level: zapcore.InfoLevel, Time: now, Message: "request"}, []zapcore.Field{zap.Inline(testFields{none: true})}},
		{"no fields", zapcore.Entry{Level: zapcore.InfoLevel, Time: now, Message: "request"}, nil},
		{"two fields", zapcore.Entry{Level: zapcore.InfoLevel, Time: now, Message: "request"}, []zapcore.Field{zap.Inline(f), zap.String("x", "y")}},
		{"object, not inline", zapcore.Entry{Level: zapcore.InfoLevel, Time: now, Message: "request"}, []zapcore.Field{zap.Object("o", f)}},
		{"other inline", zapcore.Entry{Level: zapcore.InfoLevel, Time: now, Message: "request"}, []zapcore.Field{zap.Inline(zapcore.ObjectMarshalerFunc(func(enc zapcore.ObjectEncoder) error { enc.AddString("k", "v"); return nil }))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, want := writeBoth(t, tt.ent, tt.fields...); got != want {
				t.Errorf("line\n%s\nzap writes\n%s", got, want)
			}
		})
	}
	t.Run("random", func(t *testing.T) {
		r := rand.New(rand.NewPCG(7, 8))
		zones := testZones(t)
		for range 2000 {
			ent := zapcore.Entry{Level: zapcore.Level(r.IntN(4) - 1), Message: randomString(r),
				Time: time.Unix(r.Int64N(1<<34), r.Int64N(1e9)).In(zones[r.IntN(len(zones))])}
			f := testFields{s: randomString(r), d: time.Duration(r.Int64N(1<<r.IntN(63)) - 1<<r.IntN(40)), n: r.Int64() - r.Int64(), b: r.IntN(2) == 0}
			if got, want := writeBoth(t, ent, zap.Inline(f)); got != want {
				t.Fatalf("line\n%s\nzap writes\n%s", got, want)
			}
		}
	})
}

// A core from With has context fields: its lines are zap's, fields and all.
func TestCoreWithIsZap(t *testing.T) {
	var fast, plain sink
	ent := zapcore.Entry{Level: zapcore.InfoLevel, Time: time.Now(), Message: "request"}
	f := zap.Inline(testFields{s: "x"})
	ctx := []zapcore.Field{zap.String("component", "proxy")}
	if err := NewJSONCore(&fast, zapcore.InfoLevel).With(ctx).Write(ent, []zapcore.Field{f}); err != nil {
		t.Fatal(err)
	}
	if err := zapcore.NewCore(zapcore.NewJSONEncoder(EncoderConfig()), &plain, zapcore.InfoLevel).With(ctx).Write(ent, []zapcore.Field{f}); err != nil {
		t.Fatal(err)
	}
	if fast.String() != plain.String() {
		t.Errorf("line\n%s\nzap writes\n%s", fast.String(), plain.String())
	}
}

// The core keeps the wrapped core's levels, and a logger built on it
// writes through it.
func TestCoreLevels(t *testing.T) {
	var out sink
	core := NewJSONCore(&out, zapcore.WarnLevel)
	if got := zapcore.LevelOf(core); got != zapcore.WarnLevel {
		t.Errorf("LevelOf = %v, want warn", got)
	}
	log := zap.New(core)
	if ce := log.Check(zapcore.InfoLevel, "request"); ce != nil {
		t.Error("info checked at warn")
	}
	ce := log.Check(zapcore.WarnLevel, "request")
	if ce == nil {
		t.Fatal("warn not checked at warn")
	}
	ce.Write(zap.Inline(testFields{s: "x"}))
	if want := `"level":"warn"`; !bytes.Contains(out.Bytes(), []byte(want)) {
		t.Errorf("line %s, want %s in it", out.Bytes(), want)
	}
}
