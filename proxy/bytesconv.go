package proxy

import "unsafe"

// b2s returns a string that shares b's memory instead of copying it, so request and
// response bodies can be read with string operations (gjson, switch on keys, strconv)
// without allocating a copy of every body.
//
// It is safe only while two conditions hold, and every caller must keep them: the string
// (and every substring of it) must not outlive b, and b must not be modified while the
// string is in use. Go strings are assumed immutable, so breaking either condition lets
// a string change under its reader or point into a buffer that fasthttp has handed to
// another request. openai.ValidateChat keeps both: it reads the body only while it runs, nothing
// modifies the body meanwhile, and what it returns is either a []byte slice of the body
// (documented as valid only while the body is) or error text that fmt.Sprintf or string
// concatenation has copied.
func b2s(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// s2b returns a []byte that shares s's memory. The bytes must not be
// modified: it is for fasthttp calls that only copy what they are given
// (SetCanonical copies the name and the value into the header).
func s2b(s string) []byte {
	return unsafe.Slice(unsafe.StringData(s), len(s))
}
