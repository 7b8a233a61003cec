package anthropic

import (
	"bytes"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
	"github.com/tollgate-dev/tollgate/internal/finish"
	"github.com/tollgate-dev/tollgate/internal/usagecount"
)

// Usage is a Messages API usage object's counts. Input excludes the
// prompt tokens read from the cache (CacheRead) and written to it
// (CacheCreation): the whole prompt is their sum (see Prompt).
type Usage struct {
	Input, CacheRead, CacheCreation, Output int64
	// Reported is true once a usage object was seen.
	Reported bool
}

// Prompt is the prompt's whole count: Input plus the tokens read from and
// written to the cache. Each count is at most usagecount.Max: the sum
// cannot overflow.
func (u *Usage) Prompt() int64 { return u.Input + u.CacheRead + u.CacheCreation }

// usageFields are the counts of a Messages API usage object, in Usage's
// order.
var usageFields = [...]string{"input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens"}

// Set reads a Messages API usage object into u. A stream's message_delta
// (update) carries the output counted so far, and the prompt's counts only
// when it repeats input_tokens: otherwise those message_start gave stand.
// Every count must be an integer in range (see usagecount.Read); on error
// u is left as it was. A null or absent usage is no report.
func (u *Usage) Set(v gjson.Result, update bool) error {
	if !v.Exists() || v.Type == gjson.Null {
		return nil
	}
	if !v.IsObject() {
		return &usagecount.Error{Field: "usage", Problem: "is not an object"}
	}
	var counts [len(usageFields)]gjson.Result
	var n [len(usageFields)]int64
	for i, name := range usageFields {
		counts[i] = v.Get(name)
		var err error
		if n[i], err = usagecount.Read(counts[i], name); err != nil {
			return err
		}
	}
	next := *u
	if !update || counts[0].Exists() {
		next.Input, next.CacheRead, next.CacheCreation = n[0], n[1], n[2]
	}
	if !update || counts[3].Exists() {
		next.Output = n[3]
	}
	next.Reported = true
	*u = next
	return nil
}

// StreamOptions say how an EventProcessor treats one stream's events.
type StreamOptions struct {
	// PublicModel, when non-nil, is the quoted model id message_start
	// names in place of the backend's.
	PublicModel []byte
	// Backend names the backend in the error event the client gets in
	// place of the backend's own.
	Backend string
	// Redact, when not nil, rewrites the backend's in-band error message
	// before it is kept (the message can name internal hosts or carry
	// credentials); nil keeps it as sent.
	Redact func(string) string
}

// EventProcessor accounts the events of one native Messages API stream
// and passes them on: message_start gives the reply's id and the prompt's
// usage (and names the public model), message_delta the output so far,
// content_block_delta counts as a generated token when no usage comes,
// message_stop ends the stream, and an error event is replaced by the
// gateway's (the backend's message is kept, see ErrorMessage). The zero
// value passes events through; Reset sets it up for a stream.
type EventProcessor struct {
	opts StreamOptions

	usage  Usage
	deltas int64
	events int64
	done   bool
	// errMessage is the message of an in-band error event, if one came.
	errMessage string
	// usageErr is why a usage block was refused; the stream ends there.
	usageErr error
	// replyID is message_start's message id, copied.
	replyID string
	// finish is the stop_reason message_delta gave.
	finish finish.Reasons
}

// Reset starts the processing of a stream's events.
func (p *EventProcessor) Reset(opts StreamOptions) { *p = EventProcessor{opts: opts} }

// Done reports whether message_stop came.
func (p *EventProcessor) Done() bool { return p.done }

// Events is the number of data events processed.
func (p *EventProcessor) Events() int64 { return p.events }

// Usage is the last valid usage the backend reported; Reported is false
// when there was none.
func (p *EventProcessor) Usage() Usage { return p.usage }

// UsageErr is why a usage block was refused, or nil; the event carrying it
// was not passed on, and the stream ends there.
func (p *EventProcessor) UsageErr() error { return p.usageErr }

// ErrorMessage is the backend's message of an in-band error event,
// redacted (see StreamOptions.Redact); "" when none came.
func (p *EventProcessor) ErrorMessage() string { return p.errMessage }

// ReplyID is the reply's message id, "" until message_start gave one.
func (p *EventProcessor) ReplyID() string { return p.replyID }

// FinishReasons is the stop_reason the stream's message_delta gave; none
// until it came.
func (p *EventProcessor) FinishReasons() finish.Reasons { return p.finish }

// FinishReasons is a Messages API reply's stop_reason.
func FinishReasons(reply gjson.Result) finish.Reasons {
	return finish.Of(stopReason(reply.Get("stop_reason")))
}

// stopReason is the reason a stop_reason value names: None when it is not
// a string (message_start's is null).
func stopReason(v gjson.Result) finish.Reason {
	if v.Type != gjson.String {
		return finish.None
	}
	return finish.Parse(v.Str)
}

// OutputTokens is the best count of generated tokens: the backend's own,
// or the number of content deltas streamed when it reported none.
func (p *EventProcessor) OutputTokens() int64 {
	if p.usage.Reported {
		return p.usage.Output
	}
	return p.deltas
}

// StreamErrorMessage is what the client is told of a backend's in-band
// error: the gateway's description, naming backend when it is not "".
func StreamErrorMessage(backend string) string {
	if backend != "" {
		return "Backend " + backend + " reported an error during the stream."
	}
	return "The backend reported an error during the stream."
}

// Process appends to dst what the client receives for one upstream event,
// its lines up to and including the blank line that ends it.
func (p *EventProcessor) Process(dst, ev []byte) []byte {
	start, end, ok := EventData(ev)
	if !ok {
		return append(dst, ev...)
	}
	p.events++
	data := bytesconv.String(ev[start:end])
	switch gjson.Get(data, "type").Str {
	case "message_start":
		if id := gjson.Get(data, "message.id"); id.Type == gjson.String && p.replyID == "" {
			p.replyID = strings.Clone(id.Str)
		}
		if err := p.usage.Set(gjson.Get(data, "message.usage"), false); err != nil {
			p.usageErr = err
			return dst
		}
		if model := gjson.Get(data, "message.model"); p.opts.PublicModel != nil && model.Type == gjson.String {
			at := start + model.Index
			dst = append(dst, ev[:at]...)
			dst = append(dst, p.opts.PublicModel...)
			return append(dst, ev[at+len(model.Raw):]...)
		}
	case "message_delta":
		if err := p.usage.Set(gjson.Get(data, "usage"), true); err != nil {
			p.usageErr = err
			return dst
		}
		if r := stopReason(gjson.Get(data, "delta.stop_reason")); r != finish.None {
			p.finish = finish.Of(r)
		}
	case "content_block_delta":
		p.deltas++
	case "message_stop":
		p.done = true
	case "error":
		p.errMessage = p.errorMessage(gjson.Get(data, "error"))
		return AppendErrorEvent(dst, &Error{Type: APIError, Message: StreamErrorMessage(p.opts.Backend)})
	}
	return append(dst, ev...)
}

// errorMessage is the readable message of an error event's error value,
// an object with "message" or a bare string.
func (p *EventProcessor) errorMessage(v gjson.Result) string {
	msg := "upstream stream error"
	switch m := v.Get("message"); {
	case v.Type == gjson.String:
		msg = v.Str
	case m.Exists():
		msg = m.String()
	default:
		return msg
	}
	if p.opts.Redact != nil {
		return p.opts.Redact(msg)
	}
	return strings.Clone(msg)
}

var dataPrefix = []byte("data:")

// EventData returns the offsets of the payload of an event's one "data:"
// line, after its "event:" line, as Anthropic writes events; false for an
// event without one (a comment).
func EventData(ev []byte) (start, end int, ok bool) {
	for pos := 0; pos < len(ev); {
		nl := bytes.IndexByte(ev[pos:], '\n')
		if nl < 0 {
			nl = len(ev) - pos
		}
		line := ev[pos : pos+nl]
		if bytes.HasPrefix(line, dataPrefix) {
			start, end = pos+len(dataPrefix), pos+nl
			if end > start && ev[end-1] == '\r' {
				end--
			}
			if end > start && ev[start] == ' ' {
				start++
			}
			return start, end, true
		}
		pos += nl + 1
	}
	return 0, 0, false
}
