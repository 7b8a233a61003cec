package proxy

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tollgate-dev/tollgate/openai"
)

var (
	uuidForm  = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	spanForm  = regexp.MustCompile(`^[0-9a-f]{16}$`)
	safeIDRun = regexp.MustCompile(`^[!#-\[\]-~]{1,128}$`) // visible ASCII but '"' and '\'
)

// traceparentSeeds are W3C traceparent values, valid and not.
var traceparentSeeds = []string{
	"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
	"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future",
	"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
	"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
	"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
	"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
	"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
	"00-xyz", "", "-----------------------------------------------------------",
}

// FuzzTraceparent checks that parseTraceparent never panics and that what
// it accepts is a well-formed trace context: the trace id in 36-character
// UUID form, holding the header's 32 hex digits, and the parent span id as
// the header's 16 lower-case hex digits, neither all zeros.
func FuzzTraceparent(f *testing.F) {
	for _, s := range traceparentSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, h []byte) {
		tc, err := parseTraceparent(h)
		if err != nil {
			if !errors.Is(err, errBadTraceparent) || tc != (traceContext{}) {
				t.Fatalf("refusal of %q: %+v, %v", h, tc, err)
			}
			return
		}
		if !uuidForm.MatchString(tc.traceID) || !spanForm.MatchString(tc.parentID) {
			t.Fatalf("accepted %q as trace %q parent %q", h, tc.traceID, tc.parentID)
		}
		if strings.ReplaceAll(tc.traceID, "-", "") != string(h[3:35]) || tc.parentID != string(h[36:52]) {
			t.Fatalf("accepted %q as trace %q parent %q, which are not its ids", h, tc.traceID, tc.parentID)
		}
		if tc.traceID == "00000000-0000-0000-0000-000000000000" || tc.parentID == "0000000000000000" {
			t.Fatalf("accepted all-zero ids in %q", h)
		}
		if string(h[0:2]) == "ff" || (string(h[0:2]) == "00" && len(h) != 55) {
			t.Fatalf("accepted %q, of version %q and length %d", h, h[0:2], len(h))
		}
	})
}

// FuzzTraceHeaders checks the Compat-Trace-Id / Compat-Parent-Id /
// traceparent combination: no panic; the Compat headers, when either is
// sent, decide alone and come back exactly as sent when accepted (and then
// are safe to log and echo); a parent without a trace is refused; without
// them the traceparent decides, as parseTraceparent does.
func FuzzTraceHeaders(f *testing.F) {
	tp := traceparentSeeds[0]
	seeds := [][3]string{
		{"", "", ""},
		{"run-1", "", ""},
		{"run-1", "call-2", tp},
		{"", "call-2", ""},
		{"", "", tp},
		{"has space", "", ""},
		{"t", "quo\"te", ""},
		{strings.Repeat("x", 128), strings.Repeat("y", 129), ""},
		{"caf\xc3\xa9", "", ""},
		{"", "", "00-xyz"},
	}
	for _, s := range seeds {
		f.Add([]byte(s[0]), []byte(s[1]), []byte(s[2]))
	}
	f.Fuzz(func(t *testing.T, traceID, parentID, traceparent []byte) {
		tc, err := parseTraceHeaders(traceID, parentID, traceparent)
		switch {
		case len(traceID) > 0 || len(parentID) > 0:
			if err != nil {
				if !errors.Is(err, errParentWithoutTrace) && !errors.Is(err, errBadTraceID) && !errors.Is(err, errBadParentID) {
					t.Fatalf("unexpected error %v", err)
				}
				if len(traceID) == 0 && !errors.Is(err, errParentWithoutTrace) {
					t.Fatalf("a parent without a trace refused with %v", err)
				}
				return
			}
			if tc.traceID != string(traceID) || tc.parentID != string(parentID) {
				t.Fatalf("Compat headers %q/%q became %+v", traceID, parentID, tc)
			}
			if !safeIDRun.MatchString(tc.traceID) || (tc.parentID != "" && !safeIDRun.MatchString(tc.parentID)) {
				t.Fatalf("accepted ids unsafe to log or echo: %q/%q", tc.traceID, tc.parentID)
			}
		case len(traceparent) == 0:
			if err != nil || tc != (traceContext{}) {
				t.Fatalf("no trace headers gave %+v, %v", tc, err)
			}
		default:
			want, wantErr := parseTraceparent(traceparent)
			if tc != want || !errors.Is(err, wantErr) {
				t.Fatalf("traceparent %q gave %+v, %v; parseTraceparent gives %+v, %v", traceparent, tc, err, want, wantErr)
			}
		}
	})
}

// FuzzIDBounds checks the two id rules against an oracle of their own:
// a client's id (openai.ValidID) is 1 to 128 visible ASCII characters but
// '"' and '\'; a backend's (openai.BackendID) is kept whole when it is 1 to 256
// bytes of UTF-8 without a control character, and dropped ("") otherwise,
// never cut. Every valid client id is a valid backend id, as a backend
// may echo it.
func FuzzIDBounds(f *testing.F) {
	for _, s := range []string{
		"", "a", "req-1", "chatcmpl-0123456789abcdef", "resp_67ccd2bed1ec8190", strings.Repeat("x", 128),
		strings.Repeat("x", 129), strings.Repeat("x", 256), strings.Repeat("x", 257), strings.Repeat("é", 128),
		"a\x00b", "a b", "a\"b", `a\b`, "a\x7fb", "a\tb", "\xff", "日本語", "chatcmpl-\u2028",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := openai.ValidID(s), safeIDRun.MatchString(s); got != want {
			t.Errorf("openai.ValidID(%q) = %v, want %v", s, got, want)
		}
		if openai.ValidID(s) != validID([]byte(s)) {
			t.Errorf("validID and openai.ValidID disagree on %q", s)
		}
		ok := len(s) >= 1 && len(s) <= 256 && utf8.ValidString(s) &&
			!strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f })
		switch got := openai.BackendID(s); {
		case ok && got != s:
			t.Errorf("backendID(%q) = %q, want it whole", s, got)
		case !ok && got != "":
			t.Errorf("backendID(%q) = %q, want it dropped", s, got)
		}
		if openai.ValidID(s) && openai.BackendID(s) != s {
			t.Errorf("client id %q is not a valid backend id", s)
		}
	})
}
