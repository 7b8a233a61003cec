package openai

import (
	"bytes"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
	"github.com/tollgate-dev/tollgate/internal/finish"
	"github.com/tollgate-dev/tollgate/internal/jsonscan"
)

// ReplyMembers are what the gateway reads from the top level of a
// non-streamed reply: its usage object, and the id and date by which the
// usage record is joined to an SDK's trace (see replyKeyOf).
type ReplyMembers struct {
	// Usage is the text of the first "usage" member's value, as gjson.Get
	// finds it; "" when there is none (see UsageCounts.SetChatReply).
	Usage string
	// ID is the reply's id, a copy ("" when absent or refused by
	// BackendID); Created its date ("created", or the Responses API's
	// "created_at"), 0 when absent.
	ID      string
	Created int64
	// Finish is the finish_reason of each choice of a chat or text
	// completion, in order (the first "choices" member's); none for a
	// response, whose status says how it ended (see ResponseFinish).
	Finish finish.Reasons
}

// ScanReply reports whether a non-streamed 200 body, a reply to the
// endpoint (response says the Responses API), is one JSON object nested no
// deeper than maxDepth, and finds its members. A body that is not (an HTML
// page from a proxy in front of the backend, a truncated body) must not
// reach a client that will fail to parse it.
//
// It does validReply's check and finds the reply's members in the
// same walk over the top-level object. Looking them up afterwards walked
// the reply twice more (gjson.Get for usage skips the choices, with the
// whole generated text, byte by byte), which cost more than the check.
// It finds what gjson.Get(body, "usage") and replyKeyOf(body,
// response) find; a reply with an escaped top-level key (which those
// unescape before comparing) is left to them.
func ScanReply(body []byte, maxDepth int, response bool) (m ReplyMembers, ok bool) {
	s := bytesconv.String(body)
	if !looksLikeJSONObject(body) || jsonscan.TooDeep(s, maxDepth) {
		return m, false
	}
	i := skipSpace(s, 0)
	if i >= len(s) || s[i] != '{' {
		return m, false
	}
	dateKey := "created"
	if response {
		dateKey = "created_at"
	}
	var (
		usageRaw, idRaw, dateRaw    string
		haveUsage, haveID, haveDate bool
		haveChoices                 bool
		escaped                     bool
	)
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == '}' {
		i++
	} else {
		for {
			if i >= len(s) || s[i] != '"' {
				return m, false
			}
			keyStart := i + 1
			if i, ok = validString(s, keyStart); !ok {
				return m, false
			}
			key := s[keyStart : i-1]
			i = skipSpace(s, i)
			if i >= len(s) || s[i] != ':' {
				return m, false
			}
			valStart := skipSpace(s, i+1)
			if key == "choices" && !haveChoices && !response {
				// The choices are checked by the walk that reads their
				// finish reasons, not walked twice.
				haveChoices = true
				var c choices
				if i, c, ok = choicesAt(s, valStart); ok {
					m.Finish = c.finish
				} else if i, ok = validValue(s, valStart); ok {
					m.Finish = finishReasons(gjson.Parse(s[valStart:i]))
				}
			} else {
				i, ok = validValue(s, valStart)
			}
			if !ok {
				return m, false
			}
			if strings.IndexByte(key, '\\') >= 0 {
				escaped = true
			}
			val := s[valStart:i]
			// replyKeyOf stops at the member where it has both; the
			// last id and date before that point are the ones it keeps.
			if !haveID || !haveDate {
				switch key {
				case "id":
					idRaw, haveID = val, true
				case dateKey:
					dateRaw, haveDate = val, true
				}
			}
			if key == "usage" && !haveUsage {
				usageRaw, haveUsage = val, true
			}
			var closed bool
			if i, closed, ok = separator(s, i, '}'); !ok {
				return m, false
			}
			if closed {
				break
			}
			i = skipSpace(s, i)
		}
	}
	if skipSpace(s, i) != len(s) {
		return m, false
	}
	if escaped {
		m.Usage = gjson.Get(s, "usage").Raw
		if !response {
			m.Finish = finishReasons(gjson.Get(s, "choices"))
		}
		m.ID, m.Created = replyKeyOf(body, response)
		return m, true
	}
	m.Usage = usageRaw
	if haveID {
		m.ID = idString(idRaw)
	}
	if haveDate {
		m.Created = dateInt(dateRaw)
	}
	return m, true
}

// finishReasons are the finish reasons of choices, a choices array, read
// as readGJSON reads a chunk's.
func finishReasons(choices gjson.Result) finish.Reasons {
	var rs finish.Reasons
	if choices.IsArray() {
		choices.ForEach(func(_, choice gjson.Result) bool {
			rs.Add(finishReason(choice.Get("finish_reason")))
			return true
		})
	}
	return rs
}

// idString is BackendID(gjson.Parse(raw).String()), cloned, for the text
// raw of a valid JSON value. A string without escapes, as ids are, is its
// text between the quotes: gjson's parse of it, with a look for escapes of
// its own, was a cost every reply paid for a value that needs no parse.
func idString(raw string) string {
	if len(raw) >= 2 && raw[0] == '"' && strings.IndexByte(raw, '\\') < 0 {
		return strings.Clone(BackendID(raw[1 : len(raw)-1]))
	}
	return strings.Clone(BackendID(gjson.Parse(raw).String()))
}

// dateInt is gjson.Parse(raw).Int() for the text raw of a valid JSON
// value. Up to 15 digits, a float64 holds the integer exactly, and
// gjson's Int then gives it as it is: read here from the digits, without
// gjson's parse of the number into a float.
func dateInt(raw string) int64 {
	if len(raw) == 0 || len(raw) > 15 {
		return gjson.Parse(raw).Int()
	}
	var n int64
	for i := 0; i < len(raw); i++ {
		if raw[i] < '0' || raw[i] > '9' {
			return gjson.Parse(raw).Int()
		}
		n = n*10 + int64(raw[i]-'0')
	}
	return n
}

// replyKeyOf returns the "id" of a reply as a new string, since the body
// is a pooled buffer, and its date: "created" (a chat or text completion)
// or, for a response, "created_at"; 0 when absent. The usage record keeps
// both, by which a Weave SDK's trace of the model call is joined to the gateway's call (the store reads the SDK's copy of the
// reply by the same rule). One walk of the top-level members, which stops
// once both are found: backends write them first.
func replyKeyOf(body []byte, response bool) (id string, created int64) {
	dateKey := "created"
	if response {
		dateKey = "created_at"
	}
	var haveID, haveDate bool
	gjson.Parse(bytesconv.String(body)).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "id":
			id, haveID = strings.Clone(BackendID(v.String())), true
		case dateKey:
			created, haveDate = v.Int(), true
		}
		return !haveID || !haveDate
	})
	return id, created
}

// looksLikeJSONObject is the cheap check that a reply is a JSON object:
// its first and last non-space bytes are braces. Parsing it fully would
// cost every reply time in proportion to its size.
func looksLikeJSONObject(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) >= 2 && b[0] == '{' && b[len(b)-1] == '}'
}
