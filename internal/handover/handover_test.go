package handover

import (
	"strconv"
	"testing"
)

// TestPutChunkSize checks the chunk size line against strconv's hex, at the
// end of the room given, for sizes up to what fills eight hex digits.
func TestPutChunkSize(t *testing.T) {
	for _, n := range []int{0, 1, 9, 10, 15, 16, 255, 4096, 4086, 1<<32 - 1} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			var room [10]byte
			l := PutChunkSize(room[:], n)
			want := strconv.FormatInt(int64(n), 16) + "\r\n"
			if got := string(room[len(room)-l:]); got != want {
				t.Errorf("PutChunkSize(%d) wrote %q, want %q", n, got, want)
			}
		})
	}
}
