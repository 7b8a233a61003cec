package admin

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
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

// maxQueryPage bounds the items one answer of a paged trace query
// (/feedback/query, /objs/query) holds: a larger limit is refused, and a
// query without one answers this many.
const maxQueryPage = 10000

// pageLimit checks the body's limit (negative when it gave none) against
// maxQueryPage, with the 422 FastAPI gives for a field over its bound, and
// returns the page's size.
func (v *validation) pageLimit(body map[string]any, limit int) int {
	if limit > maxQueryPage {
		v.addCtx(at(bodyLoc, "limit"), "less_than_equal", "Input should be less than or equal to "+strconv.Itoa(maxQueryPage),
			body["limit"], map[string]any{"le": maxQueryPage})
	}
	if limit < 0 {
		return maxQueryPage
	}
	return limit
}

// jsonLines is the body of a streamed trace read, as Weave streams it: fill
// encodes the next lines only when the client has taken those before, so
// memory holds one of fill's steps however long the answer. fasthttp
// closes the stream when the answer ends or the client leaves. A store
// failure midway ends the chunked answer without its last chunk, so the
// client sees it cut short rather than complete.
type jsonLines struct {
	// fill encodes the next lines with enc; false, with none, at the end.
	fill  func(enc *json.Encoder) (bool, error)
	close func() error
	log   *zap.Logger
	what  string // the read, for the log
	buf   bytes.Buffer
	enc   *json.Encoder
}

// streamLines answers rc with the JSON Lines fill makes; done is called
// when the stream is closed.
func streamLines(rc *fasthttp.RequestCtx, log *zap.Logger, what string, fill func(*json.Encoder) (bool, error), done func() error) {
	l := &jsonLines{fill: fill, close: done, log: log, what: what}
	l.enc = json.NewEncoder(&l.buf)
	l.enc.SetEscapeHTML(false)
	rc.SetStatusCode(fasthttp.StatusOK)
	rc.SetContentType("application/jsonl")
	rc.SetBodyStream(l, -1)
}

func (l *jsonLines) Read(p []byte) (int, error) {
	for l.buf.Len() == 0 {
		more, err := l.fill(l.enc)
		if err != nil {
			l.log.Error(l.what+" stream failed midway", zap.Error(err))
			return 0, err
		}
		if !more {
			return 0, io.EOF
		}
	}
	return l.buf.Read(p)
}

func (l *jsonLines) Close() error { return l.close() }
