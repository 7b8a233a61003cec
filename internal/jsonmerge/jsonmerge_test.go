package jsonmerge

import "testing"

func TestMergePatch(t *testing.T) {
	tests := []struct {
		name, target, patch, want string
	}{
		{"adds members in patch order", `{}`, `{"b":1,"a":2}`, `{"b":1,"a":2}`},
		{"keeps the target's order", `{"a":1, "b": 2}`, `{"c":3,"a":4}`, `{"a":4,"b":2,"c":3}`},
		{"null removes", `{"a":1,"b":2}`, `{"a":null}`, `{"b":2}`},
		{"merges nested objects", `{"u":{"m":{"x":1}}}`, `{"u":{"m":{"y":2},"n":{"z":null}}}`, `{"u":{"m":{"x":1,"y":2},"n":{}}}`},
		{"a non-object patch replaces", `{"a":{"b":1}}`, `{"a":[1, 2]}`, `{"a":[1,2]}`},
		{"a non-object target becomes an object", `{"a":5}`, `{"a":{"b":1}}`, `{"a":{"b":1}}`},
		{"keys are not HTML-escaped", `{}`, `{"<a&b>":"<x>"}`, `{"<a&b>":"<x>"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Patch([]byte(tt.target), []byte(tt.patch))
			if err != nil || string(got) != tt.want {
				t.Fatalf("Patch(%s, %s) = %s, %v; want %s", tt.target, tt.patch, got, err, tt.want)
			}
		})
	}
}
