package admin

import (
	"strconv"

	"github.com/valyala/fasthttp"
)

// maxReadBytes bounds what one trace read that is answered whole (not
// streamed) may take: the bytes it reads from the store plus the bytes of
// its answer. A read over it is refused with a 413 saying how to read
// less, rather than building the answer in memory.
const maxReadBytes = 16 << 20

// readBudget counts the bytes of one bounded read against maxReadBytes.
type readBudget struct {
	used int
	what string // what the client should read less of, for the error
}

// take counts n more bytes; the error once the read is over its bound.
func (b *readBudget) take(n int) *apiError {
	b.used += n
	if b.used > maxReadBytes {
		return &apiError{status: fasthttp.StatusRequestEntityTooLarge,
			detail: "The answer would take more than " + strconv.Itoa(maxReadBytes) + " bytes; " + b.what}
	}
	return nil
}
