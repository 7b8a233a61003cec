package proxy

import (
	"bytes"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/anthropic"
	"github.com/tollgate-dev/tollgate/openai"
	"github.com/tollgate-dev/tollgate/translate"
)

// messagesStream is what a Messages API stream adds to the chunk
// processor: a native stream's events pass with their usage read and the
// model renamed in message_start; a chat stream is accounted as chat's
// and translated, event by event, into Anthropic's.
type messagesStream struct {
	native bool
	// publicModel is the quoted model id message_start must name, nil
	// when the backend's is the one to show (native streams only:
	// translation writes the model itself).
	publicModel []byte
	translated  translate.Stream
	// idSet says the chat stream's id was turned into the reply's.
	idSet bool
}

// startMessages readies the stream body for a Messages API stream from b.
func (sb *streamBody) startMessages(c *exchange, served string, replyModel []byte) {
	m := &sb.messages
	m.native, m.publicModel, m.idSet = c.native, replyModel, false
	if !c.native {
		m.translated.Reset(served)
	}
	// Nothing is stripped from the events (see validateMessages), and the
	// model is renamed here, not as in chat chunks.
	sb.chunk.publicModel = nil
	sb.chunk.messages = m
}

// processMessages appends what the client receives for one upstream event
// of a Messages API stream.
func (c *chunkProcessor) processMessages(dst, ev []byte) []byte {
	m := c.messages
	if m.native {
		return c.processNativeMessages(dst, ev)
	}
	// The chat processor keeps the usage, the id and the count of deltas;
	// its output, the event itself, is replaced by the translation.
	n := len(dst)
	dst = c.processChat(dst, ev)[:n]
	if !m.idSet && c.completionID != "" {
		m.idSet = true
		c.completionID = translate.MessageID(c.completionID)
	}
	switch {
	case c.usageErr != nil:
		return dst // the stream ends with the gateway's error (see endUpstream)
	case c.errMessage != "":
		return m.translated.Fail(dst, &anthropic.Error{Type: anthropic.APIError, Message: c.streamErrorMessage()})
	}
	return m.translated.Event(dst, ev)
}

// processNativeMessages accounts one event of a native Messages API
// stream: message_start gives the id and the prompt's usage, message_delta
// the output so far, content_block_delta counts as a generated token when
// no usage comes, message_stop ends the stream, and an error event is
// replaced by the gateway's (the backend's message can name internal
// hosts; it is kept for the record).
func (c *chunkProcessor) processNativeMessages(dst, ev []byte) []byte {
	start, end, ok := messagesEventData(ev)
	if !ok {
		return append(dst, ev...)
	}
	c.events++
	data := b2s(ev[start:end])
	switch gjson.Get(data, "type").Str {
	case "message_start":
		if id := gjson.Get(data, "message.id"); id.Type == gjson.String && c.completionID == "" {
			c.completionID = strings.Clone(id.Str)
		}
		if err := c.usage.setMessagesUsage(gjson.Get(data, "message.usage"), false); err != nil {
			c.usageErr = err
			return dst
		}
		if model := gjson.Get(data, "message.model"); c.messages.publicModel != nil && model.Type == gjson.String {
			at := start + model.Index
			dst = append(dst, ev[:at]...)
			dst = append(dst, c.messages.publicModel...)
			return append(dst, ev[at+len(model.Raw):]...)
		}
	case "message_delta":
		if err := c.usage.setMessagesUsage(gjson.Get(data, "usage"), true); err != nil {
			c.usageErr = err
			return dst
		}
	case "content_block_delta":
		c.deltas++
	case "message_stop":
		c.done = true
	case "error":
		c.errMessage = inBandErrorMessage(gjson.Get(data, "error"))
		return anthropic.AppendErrorEvent(dst, &anthropic.Error{Type: anthropic.APIError, Message: c.streamErrorMessage()})
	}
	return append(dst, ev...)
}

// streamErrorMessage is what the client is told of a backend's in-band
// error (see inBandError).
func (c *chunkProcessor) streamErrorMessage() string {
	if c.backend != "" {
		return "Backend " + c.backend + " reported an error during the stream."
	}
	return "The backend reported an error during the stream."
}

// messagesEventData returns the offsets of the payload of an event's one
// "data:" line, after its "event:" line, as Anthropic writes events; false
// for an event without one (a comment).
func messagesEventData(ev []byte) (start, end int, ok bool) {
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

// appendMessagesError appends the in-band error event that ends a Messages
// API stream the gateway cannot complete: Anthropic's shape, no [DONE].
func appendMessagesError(dst []byte, e *openai.Error) []byte {
	return anthropic.AppendErrorEvent(dst, &anthropic.Error{Type: anthropic.APIError, Message: e.Message})
}
