package openai

import (
	"strconv"
	"strings"
)

// Responses API field indexes in responseFields.
const (
	rsModel = iota
	rsInput
	rsInstructions
	rsPreviousResponseID
	rsMaxOutputTokens
	rsStream
	rsTopLogprobs
	rsPriority
	rsFirstPlain // fields from here on are only type-checked
)

// responseFields are the fields of POST /v1/responses that the gateway
// checks; the many others (tools, text, reasoning…) pass to the backend.
var responseFields = []field{
	rsModel:              chatFields[fModel],
	rsInput:              newField("input", kindSpecial, notNull),
	rsInstructions:       newField("instructions", kindString, orNull),
	rsPreviousResponseID: newField("previous_response_id", kindSpecial, orNull),
	rsMaxOutputTokens:    intField("max_output_tokens", orNull, 1, "an integer of at least 1, or null"),
	rsStream:             chatFields[fStream],
	rsTopLogprobs:        intField("top_logprobs", orNull, 0, "an integer between 0 and 20, or null"),
	rsPriority:           chatFields[fPriority],
	rsFirstPlain:         chatFields[fTemperature],
	rsFirstPlain + 1:     chatFields[fTopP],
	rsFirstPlain + 2:     chatFields[fUser],
	rsFirstPlain + 3:     chatFields[fParallelToolCalls],
	rsFirstPlain + 4:     newField("store", kindBool, orNull),
	rsFirstPlain + 5:     newField("background", kindBool, orNull),
	rsFirstPlain + 6:     newField("metadata", kindObject, orNull),
	rsFirstPlain + 7:     newField("tools", kindObjectArray, orNull),
	rsFirstPlain + 8:     newField("include", kindStringArray, orNull),
	rsFirstPlain + 9:     newField("text", kindObject, orNull),
	rsFirstPlain + 10:    newField("reasoning", kindObject, orNull),
	rsFirstPlain + 11:    chatFields[fRequestID],
}

// ValidateResponses checks a POST /v1/responses body and fills req (the
// model and its offsets, stream, max_output_tokens, the size of the input
// and instructions, previous_response_id and background). The input items,
// the conversation as chat's messages are, are bounded by lim.MaxInputItems.
func ValidateResponses(body []byte, req *Request, lim BodyLimits) *ValidationError {
	var v validator
	first, verr := v.start(body, req, BodyLimits{MaxDepth: lim.MaxDepth}, `The request body is empty; send a JSON object with an "input".`)
	if verr != nil {
		return verr
	}
	seen, verr := v.walkFields(first, responseFields, func(i int, val value, n int64) *ValidationError {
		switch i {
		case rsModel:
			v.record(fModel, val, n)
		case rsInput:
			return v.responseInput(val, lim.MaxInputItems)
		case rsInstructions:
			if val.isString() {
				req.PromptBytes += len(val.raw) - 2
			}
		case rsPreviousResponseID:
			if val.isNull() {
				return nil
			}
			if !val.isString() || len(val.raw) == 2 {
				return typeError("previous_response_id", "a non-empty string or null", val)
			}
			// A copy: the body's buffer is reused once the request ends.
			req.PreviousResponseID = strings.Clone(unquote(val.raw))
		case rsMaxOutputTokens:
			req.MaxTokens = n
		case rsStream:
			v.record(fStream, val, n)
		case rsTopLogprobs:
			if n > 20 {
				return typeError("top_logprobs", responseFields[rsTopLogprobs].want, val)
			}
		case rsPriority:
			req.Priority = n
		case rsFirstPlain + 5: // background
			req.Background = val.isTrue()
		}
		return nil
	})
	if verr != nil {
		return verr
	}
	if seen&(1<<rsInput) == 0 {
		return &ValidationError{Param: "input", Message: "input is required: a string or an array of input items."}
	}
	// The Responses API reports usage in its final event whatever the
	// client asks, so there is nothing to request on the client's behalf
	// and nothing to strip from the stream: say so as a client asking for
	// all of it would.
	req.IncludeUsage, req.ContinuousUsage = true, true
	return nil
}

// responseInput checks the Responses API input: a non-empty string or a
// non-empty array of at most maxItems input items (objects; zero means no
// bound). Its text counts towards the prompt estimate as it is written,
// JSON included, which errs high.
func (v *validator) responseInput(val value, maxItems int) *ValidationError {
	v.req.PromptStart, v.req.PromptEnd = val.off, val.end()
	switch {
	case val.isString():
		if len(val.raw) == 2 {
			return &ValidationError{Param: "input", Message: "input must not be empty."}
		}
	case val.isArray():
		if len(val.raw) == 2 || skipSpace(val.raw, 1) == len(val.raw)-1 {
			return &ValidationError{Param: "input", Message: "input must not be an empty array."}
		}
		// Walked here rather than by elements, to stop at the bound.
		it := v.iter(val)
		for i := 0; ; i++ {
			_, e, ok := it.next()
			if !ok {
				break
			}
			if maxItems > 0 && i == maxItems {
				return &ValidationError{Param: "input", Message: "input has more than " + strconv.Itoa(maxItems) +
					" items; the gateway accepts at most " + strconv.Itoa(maxItems) + "."}
			}
			if !e.isObject() {
				return typeError("input["+strconv.Itoa(i)+"]", "an object", e)
			}
		}
	default:
		return typeError("input", "a string or an array of input items", val)
	}
	v.req.PromptBytes += len(val.raw)
	return nil
}
