package openai

import (
	"errors"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/internal/usagecount"
)

func TestParseUsage(t *testing.T) {
	tests := []struct {
		name  string
		usage string
		// want is prompt, completion, total, cached; wantErr the field
		// named in the error ("" for no error).
		want    [4]int64
		wantErr string
	}{
		{"vllm", `{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}`, [4]int64{10, 5, 15, 0}, ""},
		{"cached", `{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":8}}`, [4]int64{10, 5, 15, 8}, ""},
		{"null details", `{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":null}`, [4]int64{10, 5, 15, 0}, ""},
		{"no total", `{"prompt_tokens":10,"completion_tokens":5}`, [4]int64{10, 5, 15, 0}, ""},
		{"zero total", `{"prompt_tokens":10,"completion_tokens":5,"total_tokens":0}`, [4]int64{10, 5, 15, 0}, ""},
		{"total above the parts", `{"prompt_tokens":10,"completion_tokens":5,"total_tokens":20}`, [4]int64{10, 5, 20, 0}, ""},
		{"at the bound", `{"prompt_tokens":1099511627776,"completion_tokens":0}`, [4]int64{1 << 40, 0, 1 << 40, 0}, ""},
		{"over the bound", `{"prompt_tokens":1099511627777,"completion_tokens":0}`, [4]int64{}, "usage.prompt_tokens exceeds"},
		{"int64 max", `{"prompt_tokens":9223372036854775807}`, [4]int64{}, "usage.prompt_tokens exceeds"},
		{"past int64", `{"completion_tokens":99999999999999999999999}`, [4]int64{}, "usage.completion_tokens exceeds"},
		{"negative", `{"prompt_tokens":10,"completion_tokens":-1}`, [4]int64{}, "usage.completion_tokens is negative"},
		{"negative zero", `{"prompt_tokens":-0}`, [4]int64{}, "usage.prompt_tokens is negative"},
		{"exponent", `{"prompt_tokens":1e300}`, [4]int64{}, "usage.prompt_tokens is not an integer"},
		{"small exponent", `{"prompt_tokens":1e2}`, [4]int64{}, "usage.prompt_tokens is not an integer"},
		{"fraction", `{"prompt_tokens":10.5}`, [4]int64{}, "usage.prompt_tokens is not an integer"},
		{"string", `{"prompt_tokens":"10"}`, [4]int64{}, "usage.prompt_tokens is not a number"},
		{"bool", `{"total_tokens":true}`, [4]int64{}, "usage.total_tokens is not a number"},
		{"object", `{"prompt_tokens":{}}`, [4]int64{}, "usage.prompt_tokens is not a number"},
		{"total below the parts", `{"prompt_tokens":10,"completion_tokens":5,"total_tokens":3}`, [4]int64{}, "usage.total_tokens (3) is less than"},
		{"cached above the prompt", `{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":11}}`, [4]int64{}, "cached_tokens (11) exceeds"},
		{"not an object", `"lots"`, [4]int64{}, "usage is not an object"},
		{"array", `[1,2]`, [4]int64{}, "usage is not an object"},
		{"duplicate keys: the first counts", `{"prompt_tokens":10,"completion_tokens":5,"prompt_tokens":99,"prompt_tokens_details":{"cached_tokens":2},"prompt_tokens_details":{"cached_tokens":9}}`, [4]int64{10, 5, 15, 2}, ""},
		{"duplicate with a bad first", `{"prompt_tokens":-1,"prompt_tokens":10}`, [4]int64{}, "usage.prompt_tokens is negative"},
		{"escaped key", `{"prompt\u005ftokens":10,"completion_tokens":5}`, [4]int64{10, 5, 15, 0}, ""},
		{"details not an object", `{"prompt_tokens":10,"prompt_tokens_details":[8]}`, [4]int64{10, 0, 10, 0}, ""},
		{"other fields around", `{"queue_time":0.5,"prompt_tokens":10,"x":{"prompt_tokens":99},"completion_tokens":5}`, [4]int64{10, 5, 15, 0}, ""},
		{"spaces", " { \"prompt_tokens\" : 10 ,\n\"completion_tokens\":5 , \"prompt_tokens_details\" : { \"cached_tokens\" : 3 } } ", [4]int64{10, 5, 15, 3}, ""},
		{"empty", `{}`, [4]int64{}, ""},
		{"null count", `{"prompt_tokens":null,"completion_tokens":5}`, [4]int64{0, 5, 5, 0}, ""},
		{"details without the count, then with", `{"prompt_tokens":10,"prompt_tokens_details":{"audio_tokens":1},"prompt_tokens_details":{"cached_tokens":4}}`, [4]int64{10, 0, 10, 4}, ""},
		{"details with the count twice", `{"prompt_tokens":10,"prompt_tokens_details":{"x":[1,{"cached_tokens":9}],"cached_tokens":2,"cached_tokens":3}}`, [4]int64{10, 0, 10, 2}, ""},
		{"details with an escaped key", `{"prompt_tokens":10,"prompt_tokens_details":{"cached\u005ftokens":5}}`, [4]int64{10, 0, 10, 5}, ""},
		{"details a string", `{"prompt_tokens":10,"prompt_tokens_details":"cached_tokens"}`, [4]int64{10, 0, 10, 0}, ""},
		{"cached not a number", `{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":"2"}}`, [4]int64{}, "cached_tokens is not a number"},
		{"long digits", `{"prompt_tokens":00000000000001}`, [4]int64{}, "usage.prompt_tokens exceeds"},
		{"thirteen digits", `{"prompt_tokens":0000000000001}`, [4]int64{1, 0, 1, 0}, ""},
	}
	// parseValidUsage must agree with parseUsage on every valid usage.
	parsers := []struct {
		name  string
		parse func(u *UsageCounts, usage string) error
	}{
		{"parseUsage", func(u *UsageCounts, usage string) error { return u.parseUsage(gjson.Parse(usage), &chatUsageFields) }},
		{"parseValidUsage", func(u *UsageCounts, usage string) error {
			return u.parseValidUsage(strings.TrimSpace(usage), &chatUsageFields)
		}},
	}
	for _, tt := range tests {
		for _, p := range parsers {
			t.Run(tt.name+"/"+p.name, func(t *testing.T) {
				// u starts with an earlier valid report, which a refused
				// one must leave in place.
				u := UsageCounts{Input: 1, Output: 2, Total: 3, Reported: true}
				err := p.parse(&u, tt.usage)
				if tt.wantErr != "" {
					var ue *UsageError
					if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.wantErr) {
						t.Fatalf("err = %v, want a UsageError containing %q", err, tt.wantErr)
					}
					if u != (UsageCounts{Input: 1, Output: 2, Total: 3, Reported: true}) {
						t.Errorf("a refused usage changed the counts: %+v", u)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if got := [4]int64{u.Input, u.Output, u.Total, u.Cached}; got != tt.want || !u.Reported {
					t.Errorf("counts %v (reported %v), want %v", got, u.Reported, tt.want)
				}
			})
		}
	}
	t.Run("absent or null is no report", func(t *testing.T) {
		for _, v := range []gjson.Result{{}, gjson.Parse(`null`)} {
			var u UsageCounts
			if err := u.parseUsage(v, &chatUsageFields); err != nil || u.Reported {
				t.Errorf("%q: err %v, reported %v", v.Raw, err, u.Reported)
			}
			if err := u.parseValidUsage(v.Raw, &chatUsageFields); err != nil || u.Reported {
				t.Errorf("%q: parseValidUsage: err %v, reported %v", v.Raw, err, u.Reported)
			}
		}
	})
}

// TestParseUsageMatchesLookups checks parseUsage's one pass over a usage
// object against reading each count by its path, as gjson resolves paths
// (duplicate keys, details that are not objects or hold no count), over
// usages of both field sets.
func TestParseUsageMatchesLookups(t *testing.T) {
	byLookup := func(v gjson.Result, f *usageFields) (UsageCounts, string) {
		var u UsageCounts
		for _, c := range []struct {
			path string
			dst  *int64
		}{{f.input, &u.Input}, {f.output, &u.Output}, {f.total, &u.Total}, {f.cached, &u.Cached}} {
			n, err := usagecount.Read(v.Get(c.path), c.path)
			if err != nil {
				return UsageCounts{}, err.Error()
			}
			*c.dst = n
		}
		return u, ""
	}
	for _, js := range []string{
		`{}`,
		`{"prompt_tokens":1,"prompt_tokens":2,"total_tokens":3,"total_tokens":4}`,
		`{"input_tokens":7,"output_tokens":3,"input_tokens_details":{"cached_tokens":1,"cached_tokens":5}}`,
		`{"prompt_tokens_details":{"cached_tokens":4},"prompt_tokens":9}`,
		`{"prompt_tokens":9,"prompt_tokens_details":5,"prompt_tokens_details":{"cached_tokens":4}}`,
		`{"prompt_tokens":9,"prompt_tokens_details":{},"prompt_tokens_details":{"cached_tokens":4}}`,
		`{"prompt_tokens":9,"prompt_tokens_details":[{"cached_tokens":3}],"prompt_tokens_details":{"cached_tokens":4}}`,
		`{"input_tokens":9,"input_tokens_details":{"cached_tokens":-4}}`,
		`{"completion_tokens":null,"prompt_tokens":"3"}`,
		`{"prompt_tokens":-1,"prompt_tokens":10}`,
		`{"prompt\u005ftokens":10,"completion_tokens":5}`,
		` { "prompt_tokens" : 12 , "completion_tokens" :3 , "total_tokens": 15} `,
	} {
		v := gjson.Parse(js)
		for _, f := range []*usageFields{&chatUsageFields, &responsesUsageFields} {
			want, wantErr := byLookup(v, f)
			var u UsageCounts
			err := u.parseUsage(v, f)
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if gotErr != wantErr {
				t.Errorf("%s with %s: error %q, by lookup %q", js, f.input, gotErr, wantErr)
				continue
			}
			if err == nil && [3]int64{u.Input, u.Output, u.Cached} != [3]int64{want.Input, want.Output, want.Cached} {
				t.Errorf("%s with %s: counts %+v, by lookup %+v", js, f.input, u, want)
			}
		}
	}
}

// TestParseUsageAllocatesNothing guards the reading of every reply's and
// every usage event's counts.
func TestParseUsageAllocatesNothing(t *testing.T) {
	v := gjson.Parse(`{"prompt_tokens":812,"completion_tokens":256,"total_tokens":1068,"prompt_tokens_details":{"cached_tokens":512}}`)
	var u UsageCounts
	if n := testing.AllocsPerRun(100, func() {
		if err := u.parseUsage(v, &chatUsageFields); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("parseUsage allocates %.1f times, want 0", n)
	}
	if u.Cached != 512 || u.Total != 1068 {
		t.Errorf("counts %+v", u)
	}
}
