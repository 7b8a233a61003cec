package openai

import (
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/internal/finish"
	"github.com/tollgate-dev/tollgate/internal/jsonscan"
)

// A stream's events are processed on the goroutine that writes the stream
// (proxy's streamBody.run), whose stack is what an open stream holds beyond its
// buffers. Go doubles a stack when a call goes past it, and halves it in a
// collection only while it uses under a quarter of it, so the deepest call
// of processing an event sets the stack for the stream's life: the gjson
// walk of a chunk's choices (ForEach within ForEach, then Get, whose frame
// alone is large) doubled it for every open stream. A chunk's members and
// choices are read by the flat scans below instead, the gjson walk kept for
// what they do not read.

// maxChoicesDepth bounds the nesting the flat scan reads (its checks of
// values recurse once per level); deeper choices take the gjson walk.
const maxChoicesDepth = 32

// chunkFields is what processing a chunk reads from its top-level members.
type chunkFields struct {
	// modelStart and modelEnd are the offsets of the string "model"
	// value; modelStart is -1 when there is none.
	modelStart, modelEnd int
	// usage is the last "usage" member's value, its Index its offset in
	// the chunk; usageKey is the offset of its key, -1 when there is none.
	usage    gjson.Result
	usageKey int
	// usageChecked says usage's text was checked to be valid JSON (the
	// flat scan read it), so that its counts can be read without gjson.
	usageChecked bool
	// hasChoices says a "choices" member came, nonEmptyChoices that one
	// had an element; deltas counts the elements that carried content.
	hasChoices, nonEmptyChoices bool
	deltas                      int64
	// finish is the finish reasons the choices gave, in order.
	finish finish.Reasons
	// id is the first non-empty "id" (when one is wanted), created the
	// last non-zero "created".
	id      string
	created int64
	// hasError says an "error" member came, errMessage the last one's
	// message.
	hasError   bool
	errMessage string
}

// readChunkFields reads the top-level members of the chunk s, by the flat
// scans where they can, by gjson otherwise; wantID says whether its id is
// wanted (only the first chunk's is kept).
func readChunkFields(s string, wantID bool) chunkFields {
	f := chunkFields{modelStart: -1, usageKey: -1}
	if f.readFlat(s, wantID) {
		return f
	}
	f = chunkFields{modelStart: -1, usageKey: -1}
	f.readGJSON(s, wantID)
	return f
}

// readFlat reads the chunk's members with flat scans (see membersAt and
// choicesContent) and reports whether it could: false, with f partly
// filled, for what it leaves to readGJSON (not a valid JSON object, an
// escaped key, choices it does not read).
func (f *chunkFields) readFlat(s string, wantID bool) bool {
	i := skipSpace(s, 0)
	if i >= len(s) || s[i] != '{' {
		return false
	}
	end := membersAt(s, i, func(key string, k, v, vEnd int) bool {
		raw := s[v:vEnd]
		switch key {
		case "id":
			if wantID && f.id == "" {
				f.id = idString(raw)
			}
		case "created":
			if n := dateInt(raw); n != 0 {
				f.created = n
			}
		case "model":
			if raw[0] == '"' && v > 0 {
				f.modelStart, f.modelEnd = v, vEnd
			}
		case "usage":
			f.usage, f.usageKey, f.usageChecked = gjson.Parse(raw), k, true
			f.usage.Index = v
		case "choices":
			f.hasChoices = true
			c, ok := choicesContent(raw)
			if !ok {
				return false
			}
			f.nonEmptyChoices = f.nonEmptyChoices || c.elems > 0
			f.deltas += c.withContent
			f.finish.AddAll(c.finish)
		case "error":
			f.hasError, f.errMessage = true, InBandErrorMessage(gjson.Parse(raw))
		}
		return true
	})
	return end >= 0 && skipSpace(s, end) == len(s)
}

// readGJSON reads the chunk's members with gjson, whatever the chunk is.
func (f *chunkFields) readGJSON(s string, wantID bool) {
	gjson.Parse(s).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "id":
			if wantID && f.id == "" {
				f.id = strings.Clone(BackendID(v.String()))
			}
		case "created":
			if n := v.Int(); n != 0 {
				f.created = n
			}
		case "model":
			if v.Type == gjson.String && v.Index > 0 {
				f.modelStart, f.modelEnd = v.Index, v.Index+len(v.Raw)
			}
		case "usage":
			f.usage, f.usageKey = v, k.Index
		case "choices":
			f.hasChoices = true
			v.ForEach(func(_, choice gjson.Result) bool {
				f.nonEmptyChoices = true
				// Chat choices carry a delta, text completions a text.
				if deltaHasContent(choice.Get("delta")) || textHasContent(choice) {
					f.deltas++
				}
				f.finish.Add(finishReason(choice.Get("finish_reason")))
				return true
			})
		case "error":
			f.hasError, f.errMessage = true, InBandErrorMessage(v)
		}
		return true
	})
}

// choices is what a walk of a choices array reads: elems is its number of
// elements, withContent the number of objects whose first "delta" member
// is an object with generated content or whose first "text" member is a
// non-empty string, finish the string finish_reason of each object that
// has one (its first), in order.
type choices struct {
	elems, withContent int64
	finish             finish.Reasons
}

// choicesContent reads raw, a choices array, as readGJSON's walk does. ok
// is false for what it leaves to gjson: anything but a valid JSON array,
// nesting past maxChoicesDepth, or a key with an escape (gjson compares
// keys unescaped).
func choicesContent(raw string) (c choices, ok bool) {
	if len(raw) == 0 || raw[0] != '[' || jsonscan.TooDeep(raw, maxChoicesDepth) {
		return c, false
	}
	end, c, ok := choicesAt(raw, 0)
	return c, ok && skipSpace(raw, end) == len(raw)
}

// choicesAt walks the array whose bracket is at s[i], checking it is valid
// JSON, and returns where it ends and what choicesContent reads of it; ok
// is false as for choicesContent, but for the nesting, which is the
// caller's to bound.
func choicesAt(s string, i int) (end int, c choices, ok bool) {
	if i >= len(s) || s[i] != '[' {
		return 0, c, false
	}
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == ']' {
		return i + 1, c, true
	}
	for {
		if i >= len(s) {
			return 0, choices{}, false
		}
		c.elems++
		if s[i] == '{' {
			var has bool
			var reason finish.Reason
			if i, has, reason, ok = choiceContent(s, i); !ok {
				return 0, choices{}, false
			}
			if has {
				c.withContent++
			}
			c.finish.Add(reason)
		} else if i, ok = validValue(s, i); !ok {
			return 0, choices{}, false
		}
		var closed bool
		if i, closed, ok = separator(s, i, ']'); !ok {
			return 0, choices{}, false
		}
		if closed {
			return i, c, true
		}
		i = skipSpace(s, i)
	}
}

// choiceContent reads the choice object whose brace is at s[i] and returns
// where it ends, whether its first "delta" is an object with content
// (deltaHasContent) or its first "text" a non-empty string
// (textHasContent), and the reason its first "finish_reason" names.
func choiceContent(s string, i int) (end int, has bool, reason finish.Reason, ok bool) {
	var seenDelta, seenText, seenFinish bool
	end = membersAt(s, i, func(key string, _, v, vEnd int) bool {
		switch {
		case key == "delta" && !seenDelta:
			seenDelta = true
			if s[v] == '{' {
				_, deltaHas, deltaOK := deltaContent(s, v)
				if !deltaOK {
					return false
				}
				has = has || deltaHas
			}
		case key == "text" && !seenText:
			seenText = true
			has = has || s[v] == '"' && vEnd-v > 2
		case key == "finish_reason" && !seenFinish:
			seenFinish = true
			reason = finishReasonText(s[v:vEnd])
		}
		return true
	})
	return end, has, reason, end >= 0
}

// finishReasonText is the reason raw, the text of a valid JSON value,
// names when it is a string, as finishReason reads it: None otherwise.
func finishReasonText(raw string) finish.Reason {
	if raw[0] != '"' {
		return finish.None
	}
	if strings.IndexByte(raw, '\\') >= 0 {
		return finishReason(gjson.Parse(raw))
	}
	return finish.Parse(raw[1 : len(raw)-1])
}

// finishReason is the reason a finish_reason value names: None when it is
// not a string (a stream's chunks carry null until the choice ends).
func finishReason(v gjson.Result) finish.Reason {
	if v.Type != gjson.String {
		return finish.None
	}
	return finish.Parse(v.Str)
}

// deltaContent reads the delta object whose brace is at s[i] and returns
// where it ends, and whether it carried generated content as
// deltaHasContent tells it.
func deltaContent(s string, i int) (end int, has, ok bool) {
	end = membersAt(s, i, func(key string, _, v, vEnd int) bool {
		switch key {
		case "content", "reasoning", "reasoning_content":
			has = has || s[v] == '"' && vEnd-v > 2
		case "tool_calls", "function_call":
			has = has || s[v:vEnd] != "null"
		}
		return true
	})
	return end, has, end >= 0
}

// membersAt walks the object whose brace is at s[i], calling member with
// each key (unescaped keys only), the offset of its opening quote, k, and
// the offsets of its value (checked valid), s[v:vEnd]; it returns where the
// object ends, or -1 when it is not valid JSON, has an escaped key, or
// member returned false.
func membersAt(s string, i int, member func(key string, k, v, vEnd int) bool) int {
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == '}' {
		return i + 1
	}
	for {
		if i >= len(s) || s[i] != '"' {
			return -1
		}
		keyStart := i + 1
		var ok bool
		if i, ok = validString(s, keyStart); !ok {
			return -1
		}
		key := s[keyStart : i-1]
		if strings.IndexByte(key, '\\') >= 0 {
			return -1
		}
		i = skipSpace(s, i)
		if i >= len(s) || s[i] != ':' {
			return -1
		}
		v := skipSpace(s, i+1)
		if i, ok = validValue(s, v); !ok || !member(key, keyStart-1, v, i) {
			return -1
		}
		var closed bool
		if i, closed, ok = separator(s, i, '}'); !ok {
			return -1
		}
		if closed {
			return i
		}
		i = skipSpace(s, i)
	}
}
