package finish

import (
	"slices"
	"testing"
)

func TestParseNamesEveryReason(t *testing.T) {
	for r := Other + 1; int(r) < len(names); r++ {
		if got := Parse(r.String()); got != r {
			t.Errorf("Parse(%q) = %v, want %v", r.String(), got, r)
		}
	}
	for _, tt := range []struct {
		in   string
		want Reason
	}{{"", None}, {"eos", Other}, {"STOP", Other}} {
		if got := Parse(tt.in); got != tt.want {
			t.Errorf("Parse(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestResponseReason(t *testing.T) {
	for _, tt := range []struct{ status, reason, want string }{
		{"completed", "", "stop"},
		{"incomplete", "max_output_tokens", "length"},
		{"incomplete", "content_filter", "content_filter"},
		{"incomplete", "something_new", "other"},
		{"failed", "", "error"},
		{"cancelled", "", "cancelled"},
		{"in_progress", "", ""},
		{"queued", "", ""},
	} {
		if got := ResponseReason(tt.status, tt.reason).String(); got != tt.want {
			t.Errorf("ResponseReason(%q, %q) = %q, want %q", tt.status, tt.reason, got, tt.want)
		}
	}
}

func TestReasonsKeepsMaxInOrder(t *testing.T) {
	var rs Reasons
	for _, r := range []Reason{Stop, None, Length, ToolCalls, Stop, Length} {
		rs.Add(r)
	}
	if got, want := rs.AppendStrings(nil), []string{"stop", "length", "tool_calls", "stop"}; !slices.Equal(got, want) {
		t.Errorf("reasons %q, want %q", got, want)
	}
	var all Reasons
	all.Add(EndTurn)
	all.AddAll(rs)
	if all.Len() != Max || all.AppendStrings(nil)[0] != "end_turn" {
		t.Errorf("AddAll: %q", all.AppendStrings(nil))
	}
	if Of(None).Len() != 0 || Of(Stop) != (Reasons{codes: [Max]Reason{Stop}, n: 1}) {
		t.Errorf("Of: %v %v", Of(None), Of(Stop))
	}
	if n := testing.AllocsPerRun(100, func() { rs = Reasons{}; rs.Add(Parse("length")) }); n != 0 {
		t.Errorf("Parse and Add allocate %v times", n)
	}
}
