package anthropic

import (
	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
	"github.com/tollgate-dev/tollgate/internal/jsonscan"
)

// ValidReply reports whether a backend's non-streamed 200 body is one JSON
// object nested no deeper than maxDepth. The depth is checked first, since
// the syntax check recurses once per level and the body is the backend's.
func ValidReply(body []byte, maxDepth int) bool {
	s := bytesconv.String(body)
	first := skipSpace(s, 0)
	return first < len(s) && s[first] == '{' && !jsonscan.TooDeep(s, maxDepth) && gjson.Valid(s)
}
