package openai

import (
	"strings"

	"github.com/tidwall/gjson"

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
	// hasChoices says a "choices" member came, nonEmptyChoices that one
	// had an element; deltas counts the elements that carried content.
	hasChoices, nonEmptyChoices bool
	deltas                      int64
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
			f.usage, f.usageKey = gjson.Parse(raw), k
			f.usage.Index = v
		case "choices":
			f.hasChoices = true
			n, withContent, ok := choicesContent(raw)
			if !ok {
				return false
			}
			f.nonEmptyChoices = f.nonEmptyChoices || n > 0
			f.deltas += withContent
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
				return true
			})
		case "error":
			f.hasError, f.errMessage = true, InBandErrorMessage(v)
		}
		return true
	})
}

// choicesContent reads raw, a choices array, as readGJSON's walk does:
// elems is its number of elements, withContent the number of objects whose
// first "delta" member is an object with generated content or whose first
// "text" member is a non-empty string. ok is false for what it leaves to
// gjson: anything but a valid JSON array, nesting past maxChoicesDepth, or
// a key with an escape (gjson compares keys unescaped).
func choicesContent(raw string) (elems, withContent int64, ok bool) {
	if len(raw) == 0 || raw[0] != '[' || jsonscan.TooDeep(raw, maxChoicesDepth) {
		return 0, 0, false
	}
	i := skipSpace(raw, 1)
	if i < len(raw) && raw[i] == ']' {
		return 0, 0, skipSpace(raw, i+1) == len(raw)
	}
	for {
		if i >= len(raw) {
			return 0, 0, false
		}
		elems++
		if raw[i] == '{' {
			var has bool
			if i, has, ok = choiceContent(raw, i); !ok {
				return 0, 0, false
			}
			if has {
				withContent++
			}
		} else if i, ok = validValue(raw, i); !ok {
			return 0, 0, false
		}
		var closed bool
		if i, closed, ok = separator(raw, i, ']'); !ok {
			return 0, 0, false
		}
		if closed {
			return elems, withContent, skipSpace(raw, i) == len(raw)
		}
		i = skipSpace(raw, i)
	}
}

// choiceContent reads the choice object whose brace is at s[i] and returns
// where it ends, and whether its first "delta" is an object with content
// (deltaHasContent) or its first "text" a non-empty string
// (textHasContent).
func choiceContent(s string, i int) (end int, has, ok bool) {
	var seenDelta, seenText bool
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
		}
		return true
	})
	return end, has, end >= 0
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
