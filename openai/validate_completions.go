package openai

import (
	"fmt"
)

// The completions, embeddings and Responses API validators walk a body with
// the same primitives as chat (iter, value, field, check): only their field
// tables and their few special rules are their own. Fields shared with
// chat reuse chat's rows, so that they are checked with the same bounds and
// refused with the same messages.

// walkFields walks the top-level members of the object body whose opening
// brace is at first, checks every member named in fields and calls visit
// with its index in fields, its value and, for plain integer fields, the
// parsed integer. Fields of kindSpecial are left to visit. Unknown members
// pass through to the backend, as for chat, and a repeated known member is
// refused, for the same reason. It returns the bit set of the fields seen.
func (v *validator) walkFields(first int, fields []field, visit func(i int, val value, n int64) *ValidationError) (uint64, *ValidationError) {
	var seen uint64
	it := iter{s: v.s, i: first + 1, obj: true}
	for {
		key, val, ok := it.next()
		if !ok {
			return seen, nil
		}
		i := fieldIndex(fields, key)
		if i < 0 {
			continue
		}
		if seen&(1<<uint(i)) != 0 {
			return seen, &ValidationError{Param: fields[i].param, Message: fmt.Sprintf(
				"The request body repeats the key %q; send each field once, because JSON parsers disagree on which copy wins.", fields[i].param)}
		}
		seen |= 1 << uint(i)
		var n int64
		if f := &fields[i]; f.kind != kindSpecial {
			var err *ValidationError
			if n, err = v.check(f.param, f, val); err != nil {
				return seen, err
			}
		}
		if err := visit(i, val, n); err != nil {
			return seen, err
		}
	}
}

// fieldIndex is the index of the field named key in fields, or -1.
func fieldIndex(fields []field, key string) int {
	for i := range fields {
		if fields[i].key == key {
			return i
		}
	}
	return -1
}

// Completion field indexes in completionFields.
const (
	cmModel = iota
	cmPrompt
	cmBestOf
	cmEcho
	cmLogprobs
	cmMaxTokens
	cmN
	cmStop
	cmStream
	cmStreamOptions
	cmSuffix
	cmPromptLogprobs
	cmPriority
	cmResponseFormat
	cmStructuredOutputs
	cmFirstPlain // fields from here on are only type-checked
)

// maxCompletionLogprobs is the most logprobs the completions API returns
// per token, as in OpenAI's reference.
const maxCompletionLogprobs = 20

// completionFields are the fields of POST /v1/completions (OpenAI's legacy
// completions, with vLLM's sampling extras) that the gateway checks.
var completionFields = []field{
	cmModel:             chatFields[fModel],
	cmPrompt:            newField("prompt", kindSpecial, notNull),
	cmBestOf:            intField("best_of", orNull, 1, "an integer of at least 1, or null"),
	cmEcho:              newField("echo", kindBool, orNull),
	cmLogprobs:          newField("logprobs", kindSpecial, orNull),
	cmMaxTokens:         chatFields[fMaxTokens],
	cmN:                 chatFields[fN],
	cmStop:              chatFields[fStop],
	cmStream:            chatFields[fStream],
	cmStreamOptions:     chatFields[fStreamOptions],
	cmSuffix:            newField("suffix", kindString, orNull),
	cmPromptLogprobs:    chatFields[fPromptLogprobs],
	cmPriority:          chatFields[fPriority],
	cmResponseFormat:    chatFields[fResponseFormat],
	cmStructuredOutputs: chatFields[fStructuredOutputs],
	cmFirstPlain:        chatFields[fFrequencyPenalty],
	cmFirstPlain + 1:    chatFields[fPresencePenalty],
	cmFirstPlain + 2:    chatFields[fLogitBias],
	cmFirstPlain + 3:    chatFields[fSeed],
	cmFirstPlain + 4:    chatFields[fTemperature],
	cmFirstPlain + 5:    chatFields[fTopP],
	cmFirstPlain + 6:    chatFields[fUser],
	cmFirstPlain + 7:    chatFields[fTopK],
	cmFirstPlain + 8:    chatFields[fMinP],
	cmFirstPlain + 9:    chatFields[fRepetitionPenalty],
	cmFirstPlain + 10:   chatFields[fLengthPenalty],
	cmFirstPlain + 11:   chatFields[fStopTokenIDs],
	cmFirstPlain + 12:   chatFields[fIncludeStopStrInOutput],
	cmFirstPlain + 13:   chatFields[fIgnoreEOS],
	cmFirstPlain + 14:   chatFields[fMinTokens],
	cmFirstPlain + 15:   chatFields[fSkipSpecialTokens],
	cmFirstPlain + 16:   chatFields[fSpacesBetweenSpecialTokens],
	cmFirstPlain + 17:   chatFields[fTruncatePromptTokens],
	cmFirstPlain + 18:   chatFields[fAllowedTokenIDs],
	cmFirstPlain + 19:   chatFields[fBadWords],
	cmFirstPlain + 20:   chatFields[fAddSpecialTokens],
	cmFirstPlain + 21:   chatFields[fUseBeamSearch],
	cmFirstPlain + 22:   chatFields[fRequestID],
	cmFirstPlain + 23:   chatFields[fReturnTokensAsTokenIDs],
	cmFirstPlain + 24:   chatFields[fReturnTokenIDs],
	cmFirstPlain + 25:   chatFields[fKVTransferParams],
}

// ValidateCompletions checks a POST /v1/completions body and fills req:
// the model and its offsets, stream and stream_options as for chat,
// max_tokens, the number of sequences generated (the larger of n and
// best_of) and the size of the prompt. stop and logit_bias are held to the
// bounds chat's are held to.
func ValidateCompletions(body []byte, req *Request, lim BodyLimits) *ValidationError {
	var v validator
	first, verr := v.start(body, req, lim, `The request body is empty; send a JSON object with a "prompt".`)
	if verr != nil {
		return verr
	}
	// bestOf stays 0 when best_of is absent or null: as in vLLM, it then
	// defaults to n, so any n passes.
	var bestOf int64
	var promptLogprobs int64
	seen, verr := v.walkFields(first, completionFields, func(i int, val value, n int64) *ValidationError {
		switch i {
		case cmModel:
			v.record(fModel, val, n)
		case cmPrompt:
			return v.promptInput("prompt", val)
		case cmBestOf:
			if !val.isNull() {
				bestOf = n
			}
		case cmLogprobs:
			if val.isNull() {
				return nil
			}
			if x, err := v.check("logprobs", &completionLogprobsField, val); err != nil || x > maxCompletionLogprobs {
				return typeError("logprobs", completionLogprobsField.want, val)
			}
		case cmMaxTokens:
			req.MaxTokens = n
		case cmN:
			v.record(fN, val, n)
		case cmStop:
			return v.stop(val)
		case cmStream:
			v.record(fStream, val, n)
		case cmStreamOptions:
			return v.streamOptions(val)
		case cmPromptLogprobs:
			promptLogprobs = n
		case cmPriority:
			req.Priority = n
		case cmResponseFormat:
			return v.responseFormat(val)
		case cmStructuredOutputs:
			return v.structuredOutputs(val)
		}
		return nil
	})
	if verr != nil {
		return verr
	}
	if seen&(1<<cmPrompt) == 0 {
		return &ValidationError{Param: "prompt", Message: "prompt is required: a string, an array of strings, an array of token ids or an array of arrays of token ids."}
	}
	if bestOf != 0 && bestOf < req.N {
		return &ValidationError{Param: "best_of", Message: fmt.Sprintf(
			"best_of must be at least n (%d), got %d: best_of is how many sequences are generated to return the n best.", req.N, bestOf)}
	}
	if req.StreamOptions && !req.Stream {
		return &ValidationError{Param: "stream_options", Message: `stream_options is only allowed when stream is true; remove stream_options or send "stream": true.`}
	}
	if promptLogprobs > 0 && req.Stream {
		return &ValidationError{Param: "prompt_logprobs", Message: `prompt_logprobs is not available when stream is true; remove prompt_logprobs or send "stream": false.`}
	}
	// Every best_of sequence is generated, so the reservation counts them.
	req.N = max(req.N, bestOf)
	return nil
}

// completionLogprobsField is the integer logprobs of the completions API
// (chat's is a boolean); the upper bound is checked by the caller.
var completionLogprobsField = intField("logprobs", orNull, 0,
	fmt.Sprintf("an integer between 0 and %d, or null", maxCompletionLogprobs))

// promptInput checks a completions prompt or an embeddings input, named
// param: a non-empty string, or a non-empty array of non-empty strings, of
// token ids (integers of at least 0) or of non-empty arrays of token ids.
// It adds the text's bytes, and four per token id, to PromptBytes, so the
// estimate (bytes / 4) counts one token per id.
func (v *validator) promptInput(param string, val value) *ValidationError {
	const want = "a non-empty string, or a non-empty array of strings, of token ids or of arrays of token ids"
	v.req.PromptStart, v.req.PromptEnd = val.off, val.end()
	switch {
	case val.isString():
		if len(val.raw) == 2 {
			return &ValidationError{Param: param, Message: param + " must not be empty."}
		}
		v.req.PromptBytes += len(val.raw) - 2
		return nil
	case !val.isArray():
		return typeError(param, want, val)
	}
	it := v.iter(val)
	var first value
	for i := 0; ; i++ {
		_, e, ok := it.next()
		if !ok {
			if i == 0 {
				return &ValidationError{Param: param, Message: param + " must not be an empty array."}
			}
			return nil
		}
		ep := fmt.Sprintf("%s[%d]", param, i)
		if i == 0 {
			first = e
		}
		switch {
		case first.isString():
			if !e.isString() {
				return typeError(ep, "a string like the other elements", e)
			}
			if len(e.raw) == 2 {
				return &ValidationError{Param: ep, Message: ep + " must not be empty."}
			}
			v.req.PromptBytes += len(e.raw) - 2
		case first.isArray():
			if !e.isArray() {
				return typeError(ep, "an array of token ids like the other elements", e)
			}
			n, err := v.tokenIDs(ep, e)
			if err != nil {
				return err
			}
			if n == 0 {
				return &ValidationError{Param: ep, Message: ep + " must not be an empty array."}
			}
		case isInt(first.raw):
			if err := checkTokenID(ep, e); err != nil {
				return err
			}
			v.req.PromptBytes += 4
		default:
			return typeError(ep, "a string, a token id or an array of token ids", e)
		}
	}
}

// tokenIDs checks that array val, named param, holds token ids, and
// returns how many.
func (v *validator) tokenIDs(param string, val value) (int, *ValidationError) {
	it := v.iter(val)
	for i := 0; ; i++ {
		_, e, ok := it.next()
		if !ok {
			return i, nil
		}
		if err := checkTokenID(fmt.Sprintf("%s[%d]", param, i), e); err != nil {
			return i, err
		}
		v.req.PromptBytes += 4
	}
}

// tokenIDField is one token id: an integer of at least 0.
var tokenIDField = intField("token id", notNull, 0, "a token id (an integer of at least 0)")

func checkTokenID(param string, val value) *ValidationError {
	var v validator
	_, err := v.check(param, &tokenIDField, val)
	return err
}
