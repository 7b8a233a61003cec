// Package finish names why a model stopped generating, as a reply reports
// it: each chat or text completion choice's finish_reason, a Messages API
// reply's stop_reason, a Responses API response's status (see
// ResponseReason). The reasons are a small closed set, kept as one-byte
// codes: a reply's reasons are read from the backend's pooled buffer and
// carried to the usage record without a string copied or allocated.
package finish

// Reason is one reason, by code; None is no reason reported.
type Reason uint8

const (
	None Reason = iota
	// Other is a reason the set does not name: a backend's own value.
	Other
	// The OpenAI API's (and vLLM's, llama.cpp's, Ollama's) finish_reason.
	Stop
	Length
	ToolCalls
	ContentFilter
	FunctionCall
	// vLLM's, for a request it aborted or failed.
	Abort
	Error
	// The Messages API's stop_reason.
	EndTurn
	MaxTokens
	StopSequence
	ToolUse
	PauseTurn
	Refusal
	ModelContextWindowExceeded
	// The Responses API's cancelled status (see ResponseReason).
	Cancelled
)

var names = [...]string{
	None: "", Other: "other",
	Stop: "stop", Length: "length", ToolCalls: "tool_calls", ContentFilter: "content_filter",
	FunctionCall: "function_call", Abort: "abort", Error: "error",
	EndTurn: "end_turn", MaxTokens: "max_tokens", StopSequence: "stop_sequence", ToolUse: "tool_use",
	PauseTurn: "pause_turn", Refusal: "refusal", ModelContextWindowExceeded: "model_context_window_exceeded",
	Cancelled: "cancelled",
}

// Parse is the reason s names: None for "", Other for a value the set
// does not hold.
func Parse(s string) Reason {
	if s == "" {
		return None
	}
	for r := Other + 1; int(r) < len(names); r++ {
		if names[r] == s {
			return r
		}
	}
	return Other
}

// String is the reason's wire name, "" for None.
func (r Reason) String() string {
	if int(r) < len(names) {
		return names[r]
	}
	return names[Other]
}

// ResponseReason maps a Responses API response's status, and for an
// incomplete one incomplete_details.reason, to the finish reasons of the
// GenAI semantic conventions (stop, length, content_filter, error): a
// response has no finish_reason of its own. A status that is not a
// response's end (queued, in_progress) is None.
func ResponseReason(status, incompleteReason string) Reason {
	switch status {
	case "completed":
		return Stop
	case "failed":
		return Error
	case "cancelled":
		return Cancelled
	case "incomplete":
		switch incompleteReason {
		case "max_output_tokens":
			return Length
		case "content_filter":
			return ContentFilter
		}
		return Other
	}
	return None
}

// Max is how many reasons Reasons keeps: one per choice, and a request for
// more choices than this keeps the first Max.
const Max = 4

// Reasons are a reply's finish reasons, in the order its choices gave
// them; comparable, so a set of them can key a map.
type Reasons struct {
	codes [Max]Reason
	n     uint8
}

// Of is the one reason r, or no reasons when r is None.
func Of(r Reason) Reasons {
	var rs Reasons
	rs.Add(r)
	return rs
}

// Add appends r, unless it is None or Max are kept already.
func (rs *Reasons) Add(r Reason) {
	if r != None && int(rs.n) < Max {
		rs.codes[rs.n] = r
		rs.n++
	}
}

// AddAll appends each of o's reasons (see Add).
func (rs *Reasons) AddAll(o Reasons) {
	for _, r := range o.codes[:o.n] {
		rs.Add(r)
	}
}

// Len is the number of reasons kept.
func (rs Reasons) Len() int { return int(rs.n) }

// AppendStrings appends the reasons' names to dst.
func (rs Reasons) AppendStrings(dst []string) []string {
	for _, r := range rs.codes[:rs.n] {
		dst = append(dst, r.String())
	}
	return dst
}
