// Package bytesconv views bytes as a string and a string as bytes without
// copying, for the request path's parsers (gjson, switches on keys,
// strconv) and fasthttp calls that only copy what they are given. It is
// the one place that uses unsafe for it.
package bytesconv

import "unsafe"

// String returns a string that shares b's memory instead of copying it.
//
// It is safe only while two conditions hold, and every caller must keep
// them: the string (and every substring of it) must not outlive b, and b
// must not be modified while the string is in use. Go strings are assumed
// immutable, so breaking either condition lets a string change under its
// reader or point into a buffer that fasthttp has handed to another
// request. What a caller keeps of it must be a copy (strings.Clone, or text
// fmt.Sprintf or concatenation built).
func String(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// Bytes returns a []byte that shares s's memory. The bytes must not be
// modified: it is for calls that only copy what they are given (fasthttp's
// SetCanonical copies the name and the value into the header).
func Bytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
