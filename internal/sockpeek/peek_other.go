//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package sockpeek

import "errors"

// Supported says Peek can look at sockets on this platform; here it
// cannot.
const Supported = false

// Peek cannot look at a socket here: it reports Failed with
// errors.ErrUnsupported. Callers check Supported first.
func Peek(uintptr) (State, error) { return Failed, errors.ErrUnsupported }
