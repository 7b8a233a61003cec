// Package logline writes the gateway's per-request JSON log line byte for
// byte as zap's JSON encoder writes it, without zap's encoder clone and
// per-field encoder calls: the line is written for every request, and zap's
// clone and per-field calls were a sizeable share of the gateway's own work
// on a request. Anything it cannot write exactly is left to zap.
package logline

import (
	"strconv"
	"time"

	"github.com/tollgate-dev/tollgate/internal/jsonstr"
)

// AppendString appends s as a quoted JSON string, byte for byte as zap's
// JSON encoder escapes it (jsonstr.AppendZap).
func AppendString(dst []byte, s string) []byte { return jsonstr.AppendZap(dst, s) }

// AppendSeconds appends d as zap's production encoder config writes a
// duration (zapcore.SecondsDurationEncoder): float64 seconds, as
// strconv.AppendFloat(dst, s, 'f', -1, 64). Below 10^15 ns (11.5 days)
// d has at most 15 significant digits, so d/10^9 is the shortest decimal
// that reads back as that float64 (float64 tells every 15-digit decimal
// apart) and its digits are written straight from the integer; longer
// durations go through strconv.
func AppendSeconds(dst []byte, d time.Duration) []byte {
	const limit = 1e15
	if d <= -limit || d >= limit {
		return strconv.AppendFloat(dst, float64(d)/float64(time.Second), 'f', -1, 64)
	}
	if d < 0 {
		dst = append(dst, '-')
		d = -d
	}
	dst = strconv.AppendUint(dst, uint64(d/time.Second), 10)
	frac := uint64(d % time.Second)
	if frac == 0 {
		return dst
	}
	n := 9
	for frac%10 == 0 {
		frac /= 10
		n--
	}
	var digits [10]byte
	digits[0] = '.'
	for i := n; i > 0; i-- {
		digits[i] = byte('0' + frac%10)
		frac /= 10
	}
	return append(dst, digits[:n+1]...)
}

// AppendInt appends n as zap's JSON encoder writes an integer.
func AppendInt(dst []byte, n int64) []byte { return strconv.AppendInt(dst, n, 10) }

// AppendBool appends v as zap's JSON encoder writes a bool.
func AppendBool(dst []byte, v bool) []byte { return strconv.AppendBool(dst, v) }

// timeLayout is zapcore.ISO8601TimeEncoder's layout.
const timeLayout = "2006-01-02T15:04:05.000Z0700"

// appendTime appends t as zapcore.ISO8601TimeEncoder writes it, unquoted:
// t.AppendFormat(dst, timeLayout), with the digits written directly from
// the seconds and one zone look-up rather than the layout parsed again and
// the zone looked up for the date and again for the clock, work every
// line's time paid for. Years outside
// 0-9999 and zones that are not a whole number of minutes under a day go
// through AppendFormat.
func appendTime(dst []byte, t time.Time) []byte {
	// The Unix times of 0000-01-01 and 10000-01-01 UTC, a day beyond each
	// so that any zone's offset stays inside; the year is checked below.
	const minUnix, maxUnix = -62167219200 - 86400, 253402300800 + 86400
	_, off := t.Zone()
	u := t.Unix()
	if off%60 != 0 || off <= -24*3600 || off >= 24*3600 || u < minUnix || u > maxUnix {
		return t.AppendFormat(dst, timeLayout)
	}
	local := u + int64(off) // >= 0 from 1970 on; floored below for earlier times
	days, secs := local/86400, int(local%86400)
	if secs < 0 {
		days, secs = days-1, secs+86400
	}
	year, month, day := civil(days)
	if year < 0 || year > 9999 {
		return t.AppendFormat(dst, timeLayout)
	}
	ms := t.Nanosecond() / 1e6
	// Filled in place and appended once: one capacity check, not twenty.
	b := [...]byte{'0', '0', '0', '0', '-', '0', '0', '-', '0', '0', 'T', '0', '0', ':', '0', '0', ':', '0', '0', '.', '0', '0', '0', 'Z', '0', '0', '0', '0'}
	put2(b[0:2], year/100)
	put2(b[2:4], year%100)
	put2(b[5:7], month)
	put2(b[8:10], day)
	put2(b[11:13], secs/3600)
	put2(b[14:16], secs/60%60)
	put2(b[17:19], secs%60)
	b[20] = byte('0' + ms/100)
	put2(b[21:23], ms%100)
	if off == 0 {
		return append(dst, b[:24]...)
	}
	b[23] = '+'
	if off < 0 {
		b[23], off = '-', -off
	}
	put2(b[24:26], off/3600)
	put2(b[26:28], off/60%60)
	return append(dst, b[:]...)
}

// put2 writes n, 0 to 99, as two digits into b[0:2].
func put2(b []byte, n int) {
	const digits = "00010203040506070809101112131415161718192021222324252627282930313233343536373839" +
		"4041424344454647484950515253545556575859606162636465666768697071727374757677787980818283848586878889" +
		"90919293949596979899"
	b[0], b[1] = digits[2*n], digits[2*n+1]
}

// civil is the proleptic Gregorian date of the day days after 1970-01-01
// (Howard Hinnant's days_from_civil inverse, "civil_from_days").
func civil(days int64) (year, month, day int) {
	z := days + 719468 // days since 0000-03-01
	era := z / 146097
	if z < 0 && z%146097 != 0 {
		era--
	}
	doe := z - era*146097                                  // day of the 400-year era, [0, 146096]
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365 // year of the era, [0, 399]
	doy := doe - (365*yoe + yoe/4 - yoe/100)               // day of the year from March 1, [0, 365]
	mp := (5*doy + 2) / 153                                // month from March, [0, 11]
	day = int(doy - (153*mp+2)/5 + 1)
	month = int(mp + 3)
	if mp >= 10 {
		month = int(mp - 9)
	}
	year = int(yoe + era*400)
	if month <= 2 {
		year++
	}
	return year, month, day
}
