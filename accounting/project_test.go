package accounting

import (
	"errors"
	"strings"
	"testing"
)

func TestParseProject(t *testing.T) {
	long := strings.Repeat("a", 128)
	tests := []struct {
		name        string
		header      []byte
		wantTeam    string
		wantProject string
		wantErr     bool
	}{
		{name: "absent", header: nil, wantTeam: "dflt", wantProject: "inference"},
		{name: "empty", header: []byte(""), wantTeam: "dflt", wantProject: "inference"},
		{name: "blank", header: []byte("  "), wantTeam: "dflt", wantProject: "inference"},
		{name: "team and project", header: []byte("acme/chatbot"), wantTeam: "acme", wantProject: "chatbot"},
		{name: "team only", header: []byte("acme"), wantTeam: "acme", wantProject: "inference"},
		{name: "team with slash", header: []byte("acme/"), wantTeam: "acme", wantProject: "inference"},
		{name: "project only", header: []byte("/chatbot"), wantTeam: "dflt", wantProject: "chatbot"},
		{name: "lone slash", header: []byte("/"), wantTeam: "dflt", wantProject: "inference"},
		{name: "surrounding whitespace", header: []byte(" acme/chatbot\t"), wantTeam: "acme", wantProject: "chatbot"},
		{name: "every allowed character", header: []byte("A-z_0.9/b.C_d-9"), wantTeam: "A-z_0.9", wantProject: "b.C_d-9"},
		{name: "128 characters each", header: []byte(long + "/" + long), wantTeam: long, wantProject: long},

		{name: "two slashes", header: []byte("acme/chat/bot"), wantErr: true},
		{name: "trailing double slash", header: []byte("acme//"), wantErr: true},
		{name: "only slashes", header: []byte("//"), wantErr: true},
		{name: "space inside", header: []byte("ac me/chatbot"), wantErr: true},
		{name: "space around slash", header: []byte("acme / chatbot"), wantErr: true},
		{name: "team too long", header: []byte(long + "a/chatbot"), wantErr: true},
		{name: "project too long", header: []byte("acme/" + long + "a"), wantErr: true},
		{name: "team alone too long", header: []byte(long + "a"), wantErr: true},
		{name: "bad team character", header: []byte("ac:me/chatbot"), wantErr: true},
		{name: "bad project character", header: []byte("acme/chat*bot"), wantErr: true},
		{name: "backslash", header: []byte(`acme\chatbot`), wantErr: true},
		{name: "non-ASCII", header: []byte("acmé/chatbot"), wantErr: true},
		{name: "control character", header: []byte("acme/chat\x00bot"), wantErr: true},
		{name: "percent-encoded slash", header: []byte("acme%2Fchatbot"), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			team, project, err := ParseProject(tt.header, "dflt", "inference")
			if tt.wantErr {
				var pe *ProjectError
				if !errors.As(err, &pe) {
					t.Fatalf("ParseProject(%q) error = %v, want a *ProjectError", tt.header, err)
				}
				if !strings.Contains(pe.Message, "Compat-Project") {
					t.Errorf("message %q does not name the header", pe.Message)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseProject(%q) error = %v", tt.header, err)
			}
			if team != tt.wantTeam || project != tt.wantProject {
				t.Errorf("ParseProject(%q) = %q, %q, want %q, %q", tt.header, team, project, tt.wantTeam, tt.wantProject)
			}
		})
	}
}

func TestParseProjectAbsentDoesNotAllocate(t *testing.T) {
	allocs := testing.AllocsPerRun(100, func() {
		if _, _, err := ParseProject(nil, "dflt", "inference"); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("allocs = %v, want 0", allocs)
	}
}

// TestParseProjectMessages checks the refusals word for word: the proxy
// answers them to the client as they are.
func TestParseProjectMessages(t *testing.T) {
	long := strings.Repeat("a", 128)
	tests := []struct {
		header, want string
	}{
		{"acme/chat/bot", "Invalid Compat-Project header: want <team>/<project>, with at most one slash."},
		{long + "a/chatbot", "Invalid Compat-Project header: the team name is longer than 128 characters."},
		{"acme/" + long + "a", "Invalid Compat-Project header: the project name is longer than 128 characters."},
		{"ac me/chatbot", "Invalid Compat-Project header: the team name may contain only letters, digits, '.', '_' and '-'."},
		{"acme/chat*bot", "Invalid Compat-Project header: the project name may contain only letters, digits, '.', '_' and '-'."},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			_, _, err := ParseProject([]byte(tt.header), "dflt", "inference")
			if err == nil || err.Error() != tt.want {
				t.Errorf("ParseProject(%q) error = %v, want %q", tt.header, err, tt.want)
			}
		})
	}
}
