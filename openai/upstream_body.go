package openai

import (
	"bytes"

	"github.com/tidwall/sjson"
)

var (
	includeUsageOn      = []byte(`{"include_usage":true}`)
	includeContinuousOn = []byte(`{"include_usage":true,"continuous_usage_stats":true}`)
)

// AppendUpstreamBody appends the body sent upstream: the client's body,
// validated into req, with the model id rewritten to upstreamModel (the
// quoted id the backend serves the model under) and, for streams, usage
// requested on the client's behalf: include_usage always, so that every
// stream reports its usage, and continuous_usage_stats where the backend
// supports it (continuous), so that a stream cut short is still counted
// exactly. It splices at the offsets validation found instead of
// re-encoding the JSON.
func AppendUpstreamBody(dst, body []byte, req *Request, upstreamModel []byte, continuous bool) []byte {
	type edit struct {
		start, end int
		with       []byte // nil: rewrite the stream_options value
	}
	var edits [2]edit
	n := 0
	// The model is rewritten whenever the body does not already name the
	// route's upstream id: for a route with an upstream_model, and for a
	// fallback route, whose backends serve another model than the one the
	// client asked for.
	if req.ModelEnd > req.ModelStart && !bytes.Equal(body[req.ModelStart:req.ModelEnd], upstreamModel) {
		edits[n] = edit{req.ModelStart, req.ModelEnd, upstreamModel}
		n++
	}
	if req.Stream && (!req.IncludeUsage || continuous && !req.ContinuousUsage) {
		if req.StreamOptionsEnd > req.StreamOptionsStart {
			edits[n] = edit{req.StreamOptionsStart, req.StreamOptionsEnd, nil}
		} else {
			// Insert the field right after the opening brace.
			open := bytes.IndexByte(body, '{') + 1
			edits[n] = edit{open, open, nil}
		}
		n++
	}
	if n == 2 && edits[1].start < edits[0].start {
		edits[0], edits[1] = edits[1], edits[0]
	}
	pos := 0
	for _, e := range edits[:n] {
		dst = append(dst, body[pos:e.start]...)
		switch {
		case e.with != nil:
			dst = append(dst, e.with...)
		case e.start == e.end:
			dst = append(dst, `"stream_options":`...)
			dst = appendStreamOptions(dst, nil, continuous)
			dst = append(dst, ',')
		default:
			dst = appendStreamOptions(dst, body[e.start:e.end], continuous)
		}
		pos = e.end
	}
	return append(dst, body[pos:]...)
}

// appendStreamOptions appends the client's stream_options object (nil or
// null when it sent none) with include_usage, and continuous_usage_stats
// when continuous, set to true, keeping its other options.
func appendStreamOptions(dst, opts []byte, continuous bool) []byte {
	if !bytes.HasPrefix(opts, []byte("{")) {
		if continuous {
			return append(dst, includeContinuousOn...)
		}
		return append(dst, includeUsageOn...)
	}
	// sjson edits the small options object; the body around it is spliced.
	out, err := sjson.SetBytes(opts, "include_usage", true)
	if err == nil && continuous {
		out, err = sjson.SetBytes(out, "continuous_usage_stats", true)
	}
	if err != nil {
		// Validation proved opts an object, which sjson always edits; keep
		// a well-formed request regardless.
		return append(dst, includeUsageOn...)
	}
	return append(dst, out...)
}
