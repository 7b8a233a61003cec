package trace

import "testing"

func TestCallFields(t *testing.T) {
	tests := []struct {
		name       string
		call, json bool
	}{
		{"id", true, false},
		{"started_at", true, false},
		{"wb_user_id", true, false},
		{"svc_run_id", true, false},
		{"attributes", true, true},
		{"inputs", true, true},
		{"output", true, true},
		{"summary", true, true},
		{"project_id", false, false},
		{"Summary", false, false},
		{"", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IsCallField(tt.name); got != tt.call {
				t.Errorf("IsCallField(%q) = %v, want %v", tt.name, got, tt.call)
			}
			if got := IsJSONField(tt.name); got != tt.json {
				t.Errorf("IsJSONField(%q) = %v, want %v", tt.name, got, tt.json)
			}
		})
	}
}
