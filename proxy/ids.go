package proxy

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/internal/bytesconv"
	"github.com/tollgate-dev/tollgate/openai"
)

// validID reports whether a client-supplied id is safe to keep (see
// openai.ValidID).
func validID(b []byte) bool { return openai.ValidID(bytesconv.String(b)) }

// callIDs makes the call ids of one server: UUIDv7s (RFC 9562, section
// 5.7) whose 48-bit time prefix keeps the ids of one trace sortable by
// start time. uuid.NewV7 reads 16 bytes from crypto/rand for every id (a
// getrandom call) and takes a global lock; here randomness is drawn once.
// The 12 bits after the time are a counter (section 6.2, method 1) that
// keeps one server's ids strictly increasing, and the 62 bits of rand_b
// are the server's random seed mixed with the time and counter: ids of two
// replicas writing one store can only coincide if their seeds do (2^-62),
// yet the tail looks random from id to id rather than repeat the seed. It
// is not secret: one id gives the seed away, and with it the tails to
// come. No id is a capability (a call, a request or a stored response is
// reached through a key allowed its team), as RFC 9562 section 8 advises.
// The zero value works, with seed 0.
type callIDs struct {
	// seed is drawn from crypto/rand when the server is made.
	seed uint64
	// last is the time and counter of the last id, as ms<<12 | counter.
	// When 4,096 ids fall in one millisecond the counter carries into the
	// time, which runs a little ahead of the clock (as section 6.2 allows)
	// rather than repeat an id; a clock that steps back is treated alike.
	last atomic.Uint64
}

// seedFromRand draws the seed; it is called once, before any id is made.
func (g *callIDs) seedFromRand() error {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Errorf("seeding call ids: %w", err)
	}
	g.seed = binary.LittleEndian.Uint64(b[:])
	return nil
}

// next returns a new call id for a call started at now, in the 36-character
// form of uuid.UUID.String. It is safe for concurrent use.
func (g *callIDs) next(now time.Time) string {
	u := g.nextUUID(now)
	return formatUUID(&u)
}

// nextUUID is next's id as its 16 bytes, which also name the call's span
// in W3C trace context (see callSpan).
func (g *callIDs) nextUUID(now time.Time) [16]byte {
	ms := uint64(now.UnixMilli()) & (1<<48 - 1)
	var tc uint64
	for {
		last := g.last.Load()
		tc = max(ms<<12, last+1)
		if g.last.CompareAndSwap(last, tc) {
			break
		}
	}
	var u [16]byte
	binary.BigEndian.PutUint64(u[0:8], tc>>12<<16|0x7000|tc&0xfff)
	binary.BigEndian.PutUint64(u[8:16], (g.seed^mix64(tc))&(1<<62-1)|2<<62)
	return u
}

// callSpan completes tc's W3C span for the call whose id is call: its span
// id is the call id's last 8 bytes, which the 62 bits of rand_b make
// unique and never zero at no cost (no lock, no clock, no random draw),
// and which tie the span to its call; a call that starts a trace names the
// trace after itself, as Record.TraceID does.
func callSpan(tc *traceContext, call *[16]byte) accounting.SpanContext {
	sp := tc.span
	copy(sp.SpanID[:], call[8:16])
	if tc.traceID == "" {
		sp.TraceID, sp.UUIDTraceID = *call, true
	}
	return sp
}

// appendTraceparent appends the traceparent header naming sp as the
// parent: version 00, sp's trace and span ids, and the sampled flag unless
// the client's traceparent had it off.
func appendTraceparent(dst []byte, sp *accounting.SpanContext) []byte {
	dst = append(dst, "00-"...)
	dst = hex.AppendEncode(dst, sp.TraceID[:])
	dst = append(dst, '-')
	dst = hex.AppendEncode(dst, sp.SpanID[:])
	if sp.NotSampled {
		return append(dst, "-00"...)
	}
	return append(dst, "-01"...)
}

// mix64 is SplitMix64's finalizer, a bijection that spreads every bit of
// its input over the whole output.
func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// formatUUID is uuid.UUID(*u).String(), written straight into the string's
// memory, eight digits at a time (see hex8), rather than a byte at a time
// into an array the string is then copied from.
func formatUUID(u *[16]byte) string {
	b := make([]byte, 36)
	binary.LittleEndian.PutUint64(b[0:8], hex8(binary.BigEndian.Uint32(u[0:4])))
	h := hex8(binary.BigEndian.Uint32(u[4:8]))
	b[8], b[13] = '-', '-'
	binary.LittleEndian.PutUint32(b[9:13], uint32(h))
	binary.LittleEndian.PutUint32(b[14:18], uint32(h>>32))
	h = hex8(binary.BigEndian.Uint32(u[8:12]))
	b[18], b[23] = '-', '-'
	binary.LittleEndian.PutUint32(b[19:23], uint32(h))
	binary.LittleEndian.PutUint32(b[24:28], uint32(h>>32))
	binary.LittleEndian.PutUint64(b[28:36], hex8(binary.BigEndian.Uint32(u[12:16])))
	// Nothing else holds b, and nothing writes it again.
	return bytesconv.String(b)
}

// hex8 returns the eight lower-case hex digits of v, most significant
// first, as the bytes of a little-endian word: v's nibbles are spread one
// per byte, and each becomes '0'+n, plus 39 more ('a'-'0'-10) when n > 9,
// which adding 6 carries into the byte's fifth bit.
func hex8(v uint32) uint64 {
	x := uint64(v)
	x = (x | x<<16) & 0x0000ffff0000ffff
	x = (x | x<<8) & 0x00ff00ff00ff00ff
	x = (x | x<<4) & 0x0f0f0f0f0f0f0f0f
	x = bits.ReverseBytes64(x)
	letters := (x + 0x0606060606060606) >> 4 & 0x0101010101010101
	return x + 0x3030303030303030 + letters*39
}

// traceContext is where a model call joins a trace.
type traceContext struct {
	traceID  string
	parentID string
	// span is the same place in W3C trace context, its span id aside
	// (see callSpan).
	span accounting.SpanContext
}

var (
	errParentWithoutTrace = errors.New("Compat-Parent-Id requires Compat-Trace-Id")
	errBadTraceID         = errors.New("Compat-Trace-Id must be 1 to 128 visible ASCII characters")
	errBadParentID        = errors.New("Compat-Parent-Id must be 1 to 128 visible ASCII characters")
	errBadTraceparent     = errors.New("traceparent is not a valid W3C trace context (00-<32 hex>-<16 hex>-<2 hex>)")
)

// parseTraceHeaders reads Compat-Trace-Id and Compat-Parent-Id, or else a
// W3C traceparent. Both absent means the call starts a new trace.
func parseTraceHeaders(traceID, parentID, traceparent []byte) (traceContext, error) {
	if len(traceID) > 0 || len(parentID) > 0 {
		if len(traceID) == 0 {
			return traceContext{}, errParentWithoutTrace
		}
		if !validID(traceID) {
			return traceContext{}, errBadTraceID
		}
		if len(parentID) > 0 && !validID(parentID) {
			return traceContext{}, errBadParentID
		}
		tid, isUUID := w3cTraceID(traceID)
		return traceContext{traceID: string(traceID), parentID: string(parentID),
			span: accounting.SpanContext{TraceID: tid, ParentSpanID: w3cSpanID(parentID), UUIDTraceID: isUUID}}, nil
	}
	if len(traceparent) == 0 {
		return traceContext{}, nil
	}
	return parseTraceparent(traceparent)
}

// parseTraceparent parses a W3C traceparent header. The 32-hex trace id is
// written in UUID form, the id format of trace calls; the 16-hex parent
// span id is kept as is.
func parseTraceparent(h []byte) (traceContext, error) {
	// version "-" trace-id "-" parent-id "-" flags
	if len(h) < 55 || h[2] != '-' || h[35] != '-' || h[52] != '-' {
		return traceContext{}, errBadTraceparent
	}
	if len(h) > 55 && (h[0] == '0' && h[1] == '0' || h[55] != '-') {
		// Version 00 has exactly four fields; later versions may append
		// fields after a dash.
		return traceContext{}, errBadTraceparent
	}
	version, trace, parent, flags := h[0:2], h[3:35], h[36:52], h[53:55]
	var tid [16]byte
	var pid [8]byte
	if !isLowerHex(version) || !isLowerHex(trace) || !isLowerHex(parent) || !isLowerHex(flags) ||
		string(version) == "ff" {
		return traceContext{}, errBadTraceparent
	}
	if _, err := hex.Decode(tid[:], trace); err != nil {
		return traceContext{}, errBadTraceparent
	}
	if _, err := hex.Decode(pid[:], parent); err != nil {
		return traceContext{}, errBadTraceparent
	}
	if tid == ([16]byte{}) || pid == ([8]byte{}) {
		// All-zero ids are invalid per the W3C spec.
		return traceContext{}, errBadTraceparent
	}
	// Flags' bit 0 is "sampled"; the other bits are reserved.
	notSampled := unhex(flags[1])&1 == 0
	return traceContext{traceID: uuid.UUID(tid).String(), parentID: string(parent),
		span: accounting.SpanContext{TraceID: tid, ParentSpanID: pid, NotSampled: notSampled}}, nil
}

// w3cTraceID is the W3C trace id of a Compat-Trace-Id: the UUID it spells
// (as call ids and the trace ids of traceparents are written; isUUID), or
// its 32 hex digits, or else the first 16 bytes of its SHA-256, so that
// every call naming one trace lands in one OpenTelemetry trace.
func w3cTraceID(id []byte) (t [16]byte, isUUID bool) {
	if len(id) == 36 {
		if u, err := uuid.ParseBytes(id); err == nil {
			return u, true
		}
	}
	if len(id) == 32 && isLowerHex(id) {
		_, _ = hex.Decode(t[:], id)
		return t, false
	}
	sum := sha256.Sum256(id)
	copy(t[:], sum[:16])
	return t, false
}

// w3cSpanID is the W3C span id of a Compat-Parent-Id of 16 lower-case hex
// digits (a span id as traceparent writes it); zero, no parent span, for
// any other id, which names no OpenTelemetry span.
func w3cSpanID(id []byte) [8]byte {
	var s [8]byte
	if len(id) == 16 && isLowerHex(id) {
		_, _ = hex.Decode(s[:], id)
	}
	return s
}

// unhex is the value of the lower-case hex digit c.
func unhex(c byte) byte {
	if c >= 'a' {
		return c - 'a' + 10
	}
	return c - '0'
}

func isLowerHex(b []byte) bool {
	for _, c := range b {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
