package usagecount

import (
	"errors"
	"testing"

	"github.com/tidwall/gjson"
)

func TestRead(t *testing.T) {
	tests := []struct {
		name    string
		usage   string
		want    int64
		problem string // "" when the count is read
	}{
		{"a count", `{"n":42}`, 42, ""},
		{"absent is zero", `{}`, 0, ""},
		{"null is zero", `{"n":null}`, 0, ""},
		{"zero", `{"n":0}`, 0, ""},
		{"the largest", `{"n":1099511627776}`, Max, ""},
		{"one past the largest", `{"n":1099511627777}`, 0, "exceeds 2^40"},
		{"a long literal", `{"n":123456789012345678901234567890}`, 0, "exceeds 2^40"},
		{"negative", `{"n":-1}`, 0, "is negative"},
		{"a float", `{"n":1.5}`, 0, "is not an integer"},
		{"an exponent", `{"n":1e3}`, 0, "is not an integer"},
		{"a string", `{"n":"7"}`, 0, "is not a number"},
		{"an object", `{"n":{}}`, 0, "is not a number"},
		{"an array", `{"n":[1]}`, 0, "is not a number"},
		{"true", `{"n":true}`, 0, "is not a number"},
		{"false", `{"n":false}`, 0, "is not a number"},
	}
	// ReadText must read the text of every count as Read reads its
	// gjson.Result.
	readers := []struct {
		name string
		read func(r gjson.Result, path string) (int64, error)
	}{
		{"Read", Read},
		{"ReadText", func(r gjson.Result, path string) (int64, error) { return ReadText(r.Raw, path) }},
	}
	for _, tt := range tests {
		for _, r := range readers {
			t.Run(tt.name+"/"+r.name, func(t *testing.T) {
				got, err := r.read(gjson.Get(tt.usage, "n"), "prompt_tokens")
				if tt.problem == "" {
					if err != nil || got != tt.want {
						t.Fatalf("%s(%s) = %d, %v; want %d", r.name, tt.usage, got, err, tt.want)
					}
					return
				}
				var e *Error
				if !errors.As(err, &e) || e.Problem != tt.problem || e.Field != "usage.prompt_tokens" {
					t.Fatalf("%s(%s) = %d, %v; want the error %q at usage.prompt_tokens", r.name, tt.usage, got, err, tt.problem)
				}
			})
		}
	}
}
