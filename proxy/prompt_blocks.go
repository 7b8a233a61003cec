package proxy

import (
	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
)

// promptFields are the body fields that hold a prompt, by endpoint: chat's
// messages, the completions prompt, the Responses API's input.
var promptFields = [...]string{"messages", "prompt", "input"}

// promptMessages is the raw JSON of a request's prompt, which the
// scheduler's prefix signal cuts into blocks (backends.AppendBlockChain):
// the whole value of the first of promptFields the body has, as the client
// wrote it, or nil. It slices body without copying.
func promptMessages(body []byte) []byte {
	for _, f := range promptFields {
		v := gjson.Get(bytesconv.String(body), f)
		if !v.Exists() {
			continue
		}
		// For a top-level field, Index is the value's offset in body.
		if v.Index <= 0 || v.Index+len(v.Raw) > len(body) {
			return nil
		}
		return body[v.Index : v.Index+len(v.Raw)]
	}
	return nil
}
