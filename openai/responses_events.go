package openai

import (
	"bytes"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
	"github.com/tollgate-dev/tollgate/internal/finish"
)

// The Responses API streams differently from chat: usage is named
// input/output tokens, events carry an "event:" line, and a stream ends
// with response.completed (or response.failed, response.incomplete, an
// error event) rather than [DONE]. This file holds those differences.

var eventPrefix = []byte("event:")

// ResponseEventData returns the offsets of the data payload of a Responses
// API event: an optional "event:" line, then one data line. Other events
// (comments, several data lines) report false and pass through untouched.
func ResponseEventData(ev []byte) (start, end int, ok bool) {
	skip := 0
	if bytes.HasPrefix(ev, eventPrefix) {
		nl := bytes.IndexByte(ev, '\n')
		if nl < 0 {
			return 0, 0, false
		}
		skip = nl + 1
	}
	start, end, ok = eventData(ev[skip:])
	return skip + start, skip + end, ok
}

// processResponseEvent is EventProcessor.Process for the Responses API: it
// maps the model id of the response object back to the public one, keeps
// the usage of the final event (response.completed, or response.failed and
// response.incomplete, which end a stream too), counts output text deltas,
// keeps the response id and created_at of response.created, and reports an
// error event.
func (c *EventProcessor) processResponseEvent(dst, ev []byte) []byte {
	start, end, ok := ResponseEventData(ev)
	if !ok {
		return append(dst, ev...)
	}
	data := ev[start:end]
	c.events++
	// Parsed in place, as chat's chunks are (ParseBytes would copy each
	// event): results point into the scanner's buffer.
	parsed := gjson.Parse(bytesconv.String(data))
	response := parsed.Get("response")
	switch typ := parsed.Get("type").String(); typ {
	case "response.output_text.delta", "response.reasoning_text.delta", "response.function_call_arguments.delta":
		c.deltas++
	case "response.completed", "response.failed", "response.incomplete":
		if err := c.usage.SetResponses(response.Get("usage")); err != nil {
			// The event is not passed on: the stream ends with the
			// gateway's in-band error (see UsageErr).
			c.usageErr = err
			return dst
		}
		c.done = true
		c.finish = ResponseFinish(response)
		if typ == "response.failed" {
			c.errMessage = InBandErrorMessage(response.Get("error"))
		}
	case "error":
		// As for chat, the client gets the gateway's description: the
		// backend's message can name internal hosts (it is kept in
		// errMessage for the log and the record).
		c.errMessage = InBandErrorMessage(parsed)
		// An error event ends a Responses API stream, as response.failed
		// does.
		c.done = true
		msg := "The backend reported an error during the stream."
		if c.opts.Backend != "" {
			msg = "Backend " + c.opts.Backend + " reported an error during the stream."
		}
		return AppendResponsesError(dst, &Error{Type: "api_error", Code: "upstream_error", Message: msg}, parsed.Get("sequence_number").Int())
	}
	if c.replyID == "" && response.IsObject() {
		// The first response object, response.created's, is the whole
		// response as a reply's body is: the record keeps its id and
		// created_at, read by the rule of a reply, for the Weave SDK's
		// trace of the stream to fold into (its reducer starts its
		// output from this object). The id also names the response
		// whose backend the gateway remembers (see ReplyKey). Later
		// events carry the same values: one read per stream, one copy.
		c.replyID, c.created = replyKeyOf(data[response.Index:response.Index+len(response.Raw)], true)
	}
	if c.opts.PublicModel == nil || !response.IsObject() {
		return append(dst, ev...)
	}
	// A path from response gives the model's offset in data, as one from
	// the top does.
	model := response.Get("model")
	if model.Type != gjson.String || model.Index <= 0 {
		return append(dst, ev...)
	}
	at := start + model.Index
	dst = append(dst, ev[:at]...)
	dst = append(dst, c.opts.PublicModel...)
	return append(dst, ev[at+len(model.Raw):]...)
}

// ResponseFinish is the finish reason of a response object: its status
// mapped to the GenAI conventions' reasons (see finish.ResponseReason).
func ResponseFinish(response gjson.Result) finish.Reasons {
	status := response.Get("status").Str
	var incomplete string
	if status == "incomplete" {
		incomplete = response.Get("incomplete_details.reason").Str
	}
	return finish.Of(finish.ResponseReason(status, incomplete))
}

// AppendResponsesError appends the Responses API's in-band error event,
// numbered sequence, which is how a client learns of a failure after the
// 200.
func AppendResponsesError(dst []byte, e *Error, sequence int64) []byte {
	dst = append(dst, "event: error\ndata: {\"type\":\"error\",\"code\":"...)
	code := e.Code
	if code == "" {
		code = e.Type
	}
	dst = strconv.AppendQuote(dst, code)
	dst = append(dst, `,"message":`...)
	msg := (&Error{Message: e.Message}).AppendJSON(nil)
	m := gjson.GetBytes(msg, "error.message")
	dst = append(dst, m.Raw...)
	dst = append(dst, `,"param":null,"sequence_number":`...)
	dst = strconv.AppendInt(dst, sequence, 10)
	return append(dst, "}\n\n"...)
}
