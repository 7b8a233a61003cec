package openai

import (
	"bytes"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
	"github.com/tollgate-dev/tollgate/internal/finish"
)

// UsageCounts are the token counts a backend reported: Input and Output
// are chat's prompt and completion tokens, the Responses API's input and
// output tokens; Cached is the part of Input served from the prefix cache.
type UsageCounts struct {
	Input, Output, Total, Cached int64
	// Reported is true once a usage object was seen.
	Reported bool
}

// setChat takes the counts from a chat, text completion or embeddings
// usage object (see parseUsage). Streams with continuous_usage_stats carry
// cumulative usage on every chunk, so the last object seen is the whole
// count: setting, never adding, is what keeps them from being counted
// twice. A usage the flat scan of its chunk checked (valid) is read by
// parseValidUsage, without gjson's walk, which parses every number in it
// as a float.
func (u *UsageCounts) setChat(v gjson.Result, valid bool) error {
	if valid {
		return u.parseValidUsage(v.Raw, &chatUsageFields)
	}
	return u.parseUsage(v, &chatUsageFields)
}

// StreamOptions say how an EventProcessor treats one stream's events.
type StreamOptions struct {
	// StripUsage drops the usage-only chunk: the gateway asked the backend
	// for usage on the client's behalf, and the client did not ask for it.
	StripUsage bool
	// StripContinuous removes the usage member from content chunks: the
	// gateway asked for continuous usage, and the client did not.
	StripContinuous bool
	// PublicModel, when non-nil, is the quoted public model id that
	// replaces the upstream one in every chunk.
	PublicModel []byte
	// Backend names the backend in the in-band error the client gets in
	// place of the backend's own.
	Backend string
	// Responses says the events are the Responses API's (see
	// processResponseEvent); otherwise they are chat or text completion
	// chunks.
	Responses bool
}

// EventProcessor rewrites and accounts the events of one stream: it maps
// the model id back to the public one, removes the usage chunk the client
// did not ask for, and keeps the usage, the count of content deltas and
// the reply's id. The zero value passes events through; Reset sets it up
// for a stream.
type EventProcessor struct {
	opts StreamOptions

	usage UsageCounts
	// deltas counts choice deltas that carried generated content: the
	// output tokens streamed, when the backend reported no usage.
	deltas int64
	events int64
	done   bool
	// errMessage is the message of an in-band error event, if one came.
	errMessage string
	// usageErr is why a usage block was refused; the stream ends there.
	usageErr error

	// replyID is the first chunk's id, copied, and created the last
	// chunk's "created" that is not 0, which is what the Weave SDK's
	// stream reducer keeps as its call's output: a backend that dates
	// every chunk (llama.cpp, Ollama) crosses a second in a long stream.
	// For the Responses API they are the id and created_at of the first
	// response object (see processResponseEvent). The usage record keeps
	// both, by which a Weave SDK's trace of the stream is joined to it.
	replyID string
	created int64
	// finish is why the choices ended, as they came; for the Responses
	// API, the final response's status (see ResponseFinish).
	finish finish.Reasons
}

// Reset starts the processing of a stream's events.
func (c *EventProcessor) Reset(opts StreamOptions) { *c = EventProcessor{opts: opts} }

// Done reports whether the stream's end came: [DONE], or the final event
// of a Responses API stream.
func (c *EventProcessor) Done() bool { return c.done }

// Events is the number of data events processed.
func (c *EventProcessor) Events() int64 { return c.events }

// Usage is the last valid usage the backend reported; Reported is false
// when there was none.
func (c *EventProcessor) Usage() UsageCounts { return c.usage }

// UsageErr is why a usage block was refused, or nil; the event carrying it
// was not passed on, and the stream ends there.
func (c *EventProcessor) UsageErr() error { return c.usageErr }

// ErrorMessage is the backend's message of an in-band error event, "" when
// none came; the client got the gateway's description instead.
func (c *EventProcessor) ErrorMessage() string { return c.errMessage }

// FinishReasons are why the model stopped generating, as the stream told
// it: each choice's finish_reason as it came, or the Responses API's final
// status (see ResponseFinish); none when the stream ended before them.
func (c *EventProcessor) FinishReasons() finish.Reasons { return c.finish }

// ReplyKey is the reply's id (for the Responses API, the response's) and
// date, as ReplyKeyOf reads them from a reply that is not streamed.
func (c *EventProcessor) ReplyKey() (id string, created int64) { return c.replyID, c.created }

// inBandError is the error event the client gets for a backend's in-band
// error: described by the gateway, since the backend's own message can
// name internal hosts (it is kept in errMessage for the log and record).
func (c *EventProcessor) inBandError(dst []byte) []byte {
	msg := "The backend reported an error during the stream."
	if c.opts.Backend != "" {
		msg = "Backend " + c.opts.Backend + " reported an error during the stream."
	}
	dst = append(dst, "data: "...)
	dst = (&Error{Type: "api_error", Code: "upstream_error", Message: msg}).AppendJSON(dst)
	return append(dst, "\n\n"...)
}

// Process appends to dst what the client receives for one upstream event,
// an event as EventScanner returns it.
func (c *EventProcessor) Process(dst, ev []byte) []byte {
	if c.opts.Responses {
		return c.processResponseEvent(dst, ev)
	}
	start, end, ok := eventData(ev)
	if !ok {
		// Comments and multi-line events pass through untouched.
		return append(dst, ev...)
	}
	data := ev[start:end]
	if bytes.Equal(data, doneData) {
		c.done = true
		return append(dst, ev...)
	}
	c.events++
	f := readChunkFields(bytesconv.String(data), c.replyID == "")
	if f.id != "" {
		c.replyID = f.id
	}
	if f.created != 0 {
		c.created = f.created
	}
	c.deltas += f.deltas
	c.finish.AddAll(f.finish)
	if f.hasError {
		c.errMessage = f.errMessage
	}
	if c.errMessage != "" {
		return c.inBandError(dst)
	}
	// Two edits at most, applied in order of position: the model id
	// replaced, the usage member cut.
	type edit struct {
		start, end int
		with       []byte
	}
	var edits [2]edit
	n := 0
	if f.usage.Exists() && f.usage.Type != gjson.Null {
		if err := c.usage.setChat(f.usage, f.usageChecked); err != nil {
			// The chunk is not passed on: the stream ends here with the
			// gateway's in-band error (see UsageErr).
			c.usageErr = err
			return dst
		}
		if f.hasChoices && !f.nonEmptyChoices {
			if c.opts.StripUsage {
				return dst
			}
		} else if c.opts.StripContinuous && f.usageKey > 0 {
			from, to := memberSpan(data, f.usageKey, f.usage.Index+len(f.usage.Raw))
			edits[n] = edit{start + from, start + to, nil}
			n++
		}
	}
	if c.opts.PublicModel != nil && f.modelStart >= 0 {
		edits[n] = edit{start + f.modelStart, start + f.modelEnd, c.opts.PublicModel}
		n++
	}
	if n == 2 && edits[1].start < edits[0].start {
		edits[0], edits[1] = edits[1], edits[0]
	}
	pos := 0
	for _, e := range edits[:n] {
		dst = append(dst, ev[pos:e.start]...)
		dst = append(dst, e.with...)
		pos = e.end
	}
	return append(dst, ev[pos:]...)
}

// memberSpan returns the byte range to cut from a JSON object to remove the
// member whose key starts at keyStart and whose value ends at valueEnd,
// with the comma that separates it from a neighbour, so the object stays
// valid.
func memberSpan(obj []byte, keyStart, valueEnd int) (from, to int) {
	i := keyStart - 1
	for i >= 0 && isJSONSpace(obj[i]) {
		i--
	}
	if i >= 0 && obj[i] == ',' {
		return i, valueEnd
	}
	j := valueEnd
	for j < len(obj) && isJSONSpace(obj[j]) {
		j++
	}
	if j < len(obj) && obj[j] == ',' {
		return keyStart, j + 1
	}
	return keyStart, valueEnd
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// OutputTokens is the best count of generated tokens: the backend's own,
// or the number of content deltas streamed when it reported none.
func (c *EventProcessor) OutputTokens() int64 {
	if c.usage.Reported {
		return c.usage.Output
	}
	return c.deltas
}

// deltaHasContent reports whether a streamed delta carried generated
// tokens: content, reasoning or a tool call fragment.
func deltaHasContent(d gjson.Result) bool {
	if !d.IsObject() {
		return false
	}
	has := false
	d.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "content", "reasoning", "reasoning_content":
			if v.Type == gjson.String && v.Raw != `""` {
				has = true
			}
		case "tool_calls", "function_call":
			if v.Type != gjson.Null {
				has = true
			}
		}
		return !has
	})
	return has
}

// textHasContent reports whether a streamed text completion choice
// carried generated text.
func textHasContent(choice gjson.Result) bool {
	t := choice.Get("text")
	return t.Type == gjson.String && t.Raw != `""`
}

// InBandErrorMessage extracts a readable message from an in-band error
// value, which is an object with "message" or a bare string: clipped, and
// with anything shaped like a credential replaced.
func InBandErrorMessage(v gjson.Result) string {
	if v.Type == gjson.String {
		return Clip(RedactCredentials(v.String()))
	}
	if m := v.Get("message"); m.Exists() {
		return Clip(RedactCredentials(m.String()))
	}
	return "upstream stream error"
}

// RewriteModel appends body to dst with its top-level "model" value
// replaced by publicModel (already quoted). It returns body unchanged when
// there is no string model.
func RewriteModel(dst, body, publicModel []byte) []byte {
	m := gjson.Get(bytesconv.String(body), "model")
	if m.Type != gjson.String || m.Index <= 0 {
		return append(dst, body...)
	}
	dst = append(dst, body[:m.Index]...)
	dst = append(dst, publicModel...)
	return append(dst, body[m.Index+len(m.Raw):]...)
}
