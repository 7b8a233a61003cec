package logline

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// hostileStrings are strings zap escapes, or copies where one might think
// it escapes.
var hostileStrings = []string{
	"",
	"gpt-4o",
	`say "hi"`,
	`C:\models\m`,
	"a\x00b\x01c\x1f",
	"\b\f\n\r\t",
	"\x7f",
	"<script>&amp;</script>",
	"line\u2028para\u2029end",
	"\xff\xfe",
	"ok\xc3",           // truncated two-byte sequence
	"\xed\xa0\x80",     // an encoded surrogate
	"\xf4\x90\x80\x80", // beyond U+10FFFF
	"héllo wörld ☃ 🦫",
	"\ufffd",
	`\u0041`,
	"Backend sim failed\n(EOF)",
}

// randomString is a short string of bytes drawn mostly from the ones zap
// treats specially.
func randomString(r *rand.Rand) string {
	pieces := []string{"a", "Z", "0", " ", "~", "\x7f", `"`, `\`, "\n", "\r", "\t", "\x00", "\x1f", "\b",
		"é", "☃", "🦫", "\u2028", "\xff", "\xc3", "\xe2\x98", "\xed\xa0\x80", "\xf4\x90\x80\x80"}
	b := make([]byte, 0, 32)
	for range r.IntN(12) {
		b = append(b, pieces[r.IntN(len(pieces))]...)
	}
	return string(b)
}

// zapValue is how zap's JSON encoder writes the one field f: the bytes
// between `{"v":` and "}\n".
func zapValue(t *testing.T, f zapcore.Field) string {
	t.Helper()
	buf, err := zapcore.NewJSONEncoder(EncoderConfig()).EncodeEntry(zapcore.Entry{}, []zapcore.Field{f})
	if err != nil {
		t.Fatal(err)
	}
	line := buf.String()
	const prefix, suffix = `{"level":"info","msg":"","v":`, "}\n"
	if len(line) < len(prefix)+len(suffix) || line[:len(prefix)] != prefix || line[len(line)-len(suffix):] != suffix {
		t.Fatalf("zap wrote %q", line)
	}
	return line[len(prefix) : len(line)-len(suffix)]
}

func TestAppendStringMatchesZap(t *testing.T) {
	strs := append([]string{}, hostileStrings...)
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		strs = append(strs, randomString(r))
	}
	for _, s := range strs {
		if got, want := string(AppendString(nil, s)), zapValue(t, zap.String("v", s)); got != want {
			t.Errorf("AppendString(%q) = %s, zap writes %s", s, got, want)
		}
	}
}

func TestAppendSecondsMatchesZap(t *testing.T) {
	ds := []time.Duration{0, 1, -1, 999, 1000, time.Millisecond, 3 * time.Millisecond, 1234567 * time.Microsecond,
		time.Second, -time.Second, 10 * time.Second, 999999999, 1e15 - 1, -1e15 + 1, 1e15, -1e15, 1e15 + 1,
		123456789012345678, math.MaxInt64, math.MinInt64, math.MinInt64 + 1}
	r := rand.New(rand.NewPCG(3, 4))
	for range 5000 {
		// Every magnitude, from nanoseconds to centuries, of either sign.
		d := time.Duration(r.Int64N(1 << r.IntN(63)))
		if r.IntN(2) == 0 {
			d = -d
		}
		ds = append(ds, d)
	}
	for _, d := range ds {
		if got, want := string(AppendSeconds(nil, d)), zapValue(t, zap.Duration("v", d)); got != want {
			t.Errorf("AppendSeconds(%d) = %s, zap writes %s", d, got, want)
		}
	}
}

func TestAppendIntBoolMatchZap(t *testing.T) {
	for _, n := range []int64{0, 1, -1, 200, 502, math.MaxInt64, math.MinInt64} {
		if got, want := string(AppendInt(nil, n)), zapValue(t, zap.Int64("v", n)); got != want {
			t.Errorf("AppendInt(%d) = %s, zap writes %s", n, got, want)
		}
	}
	for _, v := range []bool{false, true} {
		if got, want := string(AppendBool(nil, v)), zapValue(t, zap.Bool("v", v)); got != want {
			t.Errorf("AppendBool(%t) = %s, zap writes %s", v, got, want)
		}
	}
}

// testZones are zones the gateway's clock may be in: UTC, whole hours
// either side, half and quarter hours, a zone of seconds (local mean
// time), and offsets of a day or more that the layout writes in full.
func testZones(t *testing.T) []*time.Location {
	zones := []*time.Location{time.UTC, time.Local,
		time.FixedZone("A", 3600), time.FixedZone("B", -8*3600), time.FixedZone("C", 5*3600+30*60),
		time.FixedZone("D", -(3*3600 + 30*60)), time.FixedZone("E", 12*3600+45*60), time.FixedZone("F", -30),
		time.FixedZone("G", 30), time.FixedZone("H", -(17*60 + 30)), time.FixedZone("I", 24*3600),
		time.FixedZone("J", -25*3600), time.FixedZone("K", 99*3600+59*60), time.FixedZone("L", 59)}
	for _, name := range []string{"America/New_York", "Asia/Kolkata", "Australia/Lord_Howe", "Europe/Amsterdam"} {
		if loc, err := time.LoadLocation(name); err == nil {
			zones = append(zones, loc)
		} else {
			t.Logf("zone %s: %v", name, err)
		}
	}
	return zones
}

func TestAppendTimeMatchesLayout(t *testing.T) {
	times := []time.Time{time.Now(), {}, time.Unix(0, 0), time.Date(2026, 1, 2, 3, 4, 5, 999999999, time.UTC),
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(1850, 6, 1, 12, 0, 0, 0, time.UTC)}
	r := rand.New(rand.NewPCG(5, 6))
	for range 3000 {
		times = append(times, time.Unix(r.Int64N(1<<36)-1<<35, r.Int64N(1e9)))
	}
	// Every year from before 0 to after 9999, and the days around each end.
	const year0, year10000 = -62167219200, 253402300800
	for range 3000 {
		times = append(times, time.Unix(year0-3*86400+r.Int64N(year10000-year0+6*86400), r.Int64N(1e9)),
			time.Unix(year0+r.Int64N(4*86400)-2*86400, 0), time.Unix(year10000+r.Int64N(4*86400)-2*86400, 0))
	}
	for _, loc := range testZones(t) {
		for _, tm := range times {
			tm = tm.In(loc)
			if got, want := string(appendTime(nil, tm)), tm.Format(timeLayout); got != want {
				t.Errorf("appendTime(%v) = %s, want %s", tm, got, want)
			}
		}
	}
}

// The integer path of AppendSeconds is the shortest float formatting,
// checked against strconv over the whole range it covers, not only the
// values that happen to be drawn above.
func FuzzAppendSeconds(f *testing.F) {
	f.Add(int64(1234567))
	f.Fuzz(func(t *testing.T, n int64) {
		d := time.Duration(n)
		if got, want := string(AppendSeconds(nil, d)), strconv.FormatFloat(float64(d)/float64(time.Second), 'f', -1, 64); got != want {
			t.Errorf("AppendSeconds(%d) = %s, want %s", d, got, want)
		}
	})
}

// BenchmarkAppendString appends the strings of a typical request line.
func BenchmarkAppendString(b *testing.B) {
	strs := []string{"request", "0193b2f0-7c1e-7a3b-9a51-3f0c2d9e8b71", "chat", "demo", "sim", "bench", "bench", "default", ""}
	dst := make([]byte, 0, 512)
	for b.Loop() {
		dst = dst[:0]
		for _, s := range strs {
			dst = AppendString(dst, s)
		}
	}
}
