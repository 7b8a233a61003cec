package openai

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// TestScanReplyMatchesLookups checks scanReply against what it replaces:
// validReply, gjson.Get(body, "usage") and replyKeyOf.
func TestScanReplyMatchesLookups(t *testing.T) {
	for _, tt := range []struct {
		name string
		body string
	}{
		{"typical", `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi \"usage\": {}"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`},
		{"spaces", " \n{ \"usage\" : { \"prompt_tokens\" : 1 } , \"id\" : \"x\" , \"created\" : 3 }\t"},
		{"no usage", `{"id":"a","created":1}`},
		{"null usage", `{"id":"a","created":1,"usage":null}`},
		{"usage not an object", `{"usage":[1,2]}`},
		{"nested usage only", `{"choices":[{"usage":{"prompt_tokens":9}}],"x":{"usage":1}}`},
		{"duplicate usage", `{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2}}`},
		{"duplicate id before created", `{"id":"a","id":"b","created":2,"id":"c"}`},
		{"id and created late", `{"usage":{"prompt_tokens":1},"created":5,"id":7}`},
		{"escaped id string", `{"id":"a\u0062\n","created":1}`},
		{"escaped key", `{"us\u0061ge":{"prompt_tokens":4},"\u0069d":"z","created":1}`},
		{"created as float", `{"id":"a","created":1.5e3}`},
		{"responses date", `{"id":"resp_1","created_at":9,"created":1,"usage":{"input_tokens":1}}`},
		{"empty object", `{}`},
		{"empty object spaced", `{ }`},
		{"not an object", `[1]`},
		{"trailing garbage", `{"a":1} x`},
		{"two objects", `{"a":1}{"b":2}`},
		{"missing colon", `{"a" 1}`},
		{"trailing comma", `{"a":1,}`},
		{"bad value", `{"a":tru}`},
		{"truncated", `{"id":"a","usage":{"prompt_tokens":1}`},
		{"too deep", `{"a":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`},
		{"bad utf8 key", "{\"\xff\":1}"},
	} {
		for _, response := range []bool{false, true} {
			t.Run(tt.name, func(t *testing.T) {
				body := []byte(tt.body)
				const depth = 32
				m, ok := ScanReply(body, depth, response)
				if want := validReply(body, depth); ok != want {
					t.Fatalf("ok = %v, validReply says %v", ok, want)
				}
				if !ok {
					return
				}
				if want := gjson.Get(tt.body, "usage").Raw; m.Usage != want {
					t.Errorf("usage = %q, gjson.Get says %q", m.Usage, want)
				}
				id, created := replyKeyOf(body, response)
				if m.ID != id || m.Created != created {
					t.Errorf("id, created = %q, %d; replyKeyOf says %q, %d", m.ID, m.Created, id, created)
				}
			})
		}
	}
}

// TestReplyAccountingAllocs guards the reply's accounting against
// allocating per request beyond the id the record keeps.
func TestReplyAccountingAllocs(t *testing.T) {
	body := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}`)
	var u UsageCounts
	allocs := testing.AllocsPerRun(100, func() {
		m, ok := ScanReply(body, 32, false)
		if !ok || m.ID != "chatcmpl-1" {
			t.Fatal("reply refused")
		}
		if err := u.parseValidUsage(m.Usage, &chatUsageFields); err != nil || u.Total != 7 {
			t.Fatalf("usage: %v %+v", err, u)
		}
	})
	if allocs > 1 {
		t.Errorf("%v allocations per reply, want at most 1 (the id)", allocs)
	}
}

// TestIDStringDateIntMatchGjson checks the reply's id and date read
// without gjson against gjson's reading (the id through backendID, which
// drops an id it does not keep), for the values a backend may
// send: plain and escaped strings, every length of integer around 15
// digits, and numbers that are not plain integers.
func TestIDStringDateIntMatchGjson(t *testing.T) {
	values := []string{`"chatcmpl-1"`, `""`, `"a\u0062\n"`, `"\""`, `"é"`, `7`, `-7`, `0`, `1.5e3`, `1e2`, `-0`,
		`null`, `true`, `{"a":1}`, `[1]`, `123456789012345`, `999999999999999`, `1234567890123456`,
		`9007199254740993`, `99999999999999999999`, `-123456789012345`, `1700000000`, `12.0`}
	for i := 1; i <= 20; i++ {
		values = append(values, strings.Repeat("9", i), "1"+strings.Repeat("0", i-1))
	}
	for _, v := range values {
		t.Run(v, func(t *testing.T) {
			if got, want := idString(v), BackendID(gjson.Parse(v).String()); got != want {
				t.Errorf("idString = %q, gjson says %q", got, want)
			}
			if got, want := dateInt(v), gjson.Parse(v).Int(); got != want {
				t.Errorf("dateInt = %d, gjson says %d", got, want)
			}
		})
	}
}
