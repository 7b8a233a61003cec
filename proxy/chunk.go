package proxy

import (
	"bytes"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/openai"
)

// usageCounts are the token counts a backend reported.
type usageCounts struct {
	prompt, completion, total, cached int64
	// reported is true once a usage object was seen.
	reported bool
}

// set takes the counts from a usage object (see parseUsage). Streams with
// continuous_usage_stats carry cumulative usage on every chunk, so the last
// object seen is the whole count: setting, never adding, is what keeps them
// from being counted twice.
func (u *usageCounts) set(v gjson.Result) error { return u.parseUsage(v, &chatUsageFields) }

// chunkProcessor rewrites and accounts the events of one stream: it maps
// the model id back to the public one, removes the usage chunk the client
// did not ask for, and keeps the usage and the count of content deltas.
type chunkProcessor struct {
	// stripUsage drops the usage-only chunk: the gateway asked the backend
	// for usage on the client's behalf, and the client did not ask for it.
	stripUsage bool
	// stripContinuous removes the usage member from content chunks: the
	// gateway asked for continuous usage, and the client did not.
	stripContinuous bool
	// publicModel, when non-nil, is the quoted public model id that
	// replaces the upstream one in every chunk.
	publicModel []byte

	usage usageCounts
	// deltas counts choice deltas that carried generated content: the
	// completion tokens streamed, when the backend reported no usage.
	deltas int64
	events int64
	done   bool
	// errMessage is the message of an in-band error event, if one came.
	errMessage string
	// usageErr is why a usage block was refused; the stream ends there.
	usageErr error
	// backend names the backend in the in-band error the client gets in
	// place of the backend's own.
	backend string

	// responses says the events are the Responses API's (see
	// processResponseEvent); responseIDNoted is set once the stream body
	// has remembered the backend of the response, completionID.
	responses       bool
	responseIDNoted bool
	// messages, when not nil, makes the events a Messages API stream's
	// (see processMessages).
	messages *messagesStream

	// completionID is the first chunk's id, copied, and created the last
	// chunk's "created" that is not 0, which is what the Weave SDK's
	// stream reducer keeps as its call's output: a backend that dates
	// every chunk (llama.cpp, Ollama) crosses a second in a long stream.
	// For the Responses API they are the id and created_at of the first
	// response object (see processResponseEvent). The usage record keeps
	// both (see accounting.Record).
	completionID string
	created      int64
}

func (c *chunkProcessor) reset(stripUsage, stripContinuous bool, publicModel []byte) {
	*c = chunkProcessor{stripUsage: stripUsage, stripContinuous: stripContinuous, publicModel: publicModel}
}

// inBandError is the error event the client gets for a backend's in-band
// error: described by the gateway, since the backend's own message can
// name internal hosts (it is kept in errMessage for the log and record).
func (c *chunkProcessor) inBandError(dst []byte) []byte {
	dst = append(dst, "data: "...)
	dst = (&openai.Error{Type: "api_error", Code: "upstream_error", Message: c.streamErrorMessage()}).AppendJSON(dst)
	return append(dst, "\n\n"...)
}

// process appends to dst what the client receives for one upstream event.
func (c *chunkProcessor) process(dst, ev []byte) []byte {
	if c.responses {
		return c.processResponseEvent(dst, ev)
	}
	if c.messages != nil {
		return c.processMessages(dst, ev)
	}
	return c.processChat(dst, ev)
}

// processChat is process for a chat or text completion stream's event.
func (c *chunkProcessor) processChat(dst, ev []byte) []byte {
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
	f := readChunkFields(b2s(data), c.completionID == "")
	if f.id != "" {
		c.completionID = f.id
	}
	if f.created != 0 {
		c.created = f.created
	}
	c.deltas += f.deltas
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
		if err := c.usage.set(f.usage); err != nil {
			// The chunk is not passed on: the stream ends here with the
			// gateway's in-band error (see streamBody.fill).
			c.usageErr = err
			return dst
		}
		if f.hasChoices && !f.nonEmptyChoices {
			if c.stripUsage {
				return dst
			}
		} else if c.stripContinuous && f.usageKey > 0 {
			from, to := memberSpan(data, f.usageKey, f.usage.Index+len(f.usage.Raw))
			edits[n] = edit{start + from, start + to, nil}
			n++
		}
	}
	if c.publicModel != nil && f.modelStart >= 0 {
		edits[n] = edit{start + f.modelStart, start + f.modelEnd, c.publicModel}
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

// completionTokens is the best count of generated tokens: the backend's
// own, or the number of content deltas streamed when it reported none.
func (c *chunkProcessor) completionTokens() int64 {
	if c.usage.reported {
		return c.usage.completion
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

// inBandErrorMessage extracts a readable message from an in-band error
// value, which is an object with "message" or a bare string.
func inBandErrorMessage(v gjson.Result) string {
	if v.Type == gjson.String {
		return openai.Clip(redactCredentials(v.String()))
	}
	if m := v.Get("message"); m.Exists() {
		return openai.Clip(redactCredentials(m.String()))
	}
	return "upstream stream error"
}

// rewriteModel appends body to dst with its top-level "model" value
// replaced by publicModel (already quoted). It returns body unchanged when
// there is no string model.
func rewriteModel(dst, body, publicModel []byte) []byte {
	m := gjson.Get(b2s(body), "model")
	if m.Type != gjson.String || m.Index <= 0 {
		return append(dst, body...)
	}
	dst = append(dst, body[:m.Index]...)
	dst = append(dst, publicModel...)
	return append(dst, body[m.Index+len(m.Raw):]...)
}
