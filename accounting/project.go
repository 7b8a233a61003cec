package accounting

import "bytes"

// maxProjectPart is the longest team or project name a Compat-Project
// header may carry. Names end up in metric labels, log lines and the store,
// so they are kept short and plain.
const maxProjectPart = 128

// ProjectError reports a malformed Compat-Project header. The proxy answers
// it with 400 invalid_request_error and Message as it is: a whole sentence
// naming the header, safe to show the client (it never echoes the header
// value back).
type ProjectError struct {
	Message string
}

func (e *ProjectError) Error() string { return e.Message }

// ParseProject parses a Compat-Project header value: "<team>/<project>",
// where either part may be empty or absent ("acme/chatbot", "acme",
// "acme/", "/chatbot"). Empty parts fall back to defaultTeam and
// defaultProject; a nil or empty header means the header is absent.
//
// Each part may hold only [A-Za-z0-9._-] and at most 128 characters, and
// there is at most one slash; anything else is a *ProjectError. Whether the
// key may charge the team is not decided here: the caller checks it (403).
func ParseProject(header []byte, defaultTeam, defaultProject string) (team, project string, err error) {
	// Surrounding whitespace is not part of an HTTP field value.
	header = bytes.Trim(header, " \t")
	if len(header) == 0 {
		return defaultTeam, defaultProject, nil
	}
	teamPart, projectPart := header, []byte(nil)
	if i := bytes.IndexByte(header, '/'); i >= 0 {
		teamPart, projectPart = header[:i], header[i+1:]
		if bytes.IndexByte(projectPart, '/') >= 0 {
			return "", "", &ProjectError{Message: "Invalid Compat-Project header: want <team>/<project>, with at most one slash."}
		}
	}
	if err := checkProjectPart("team", teamPart); err != nil {
		return "", "", err
	}
	if err := checkProjectPart("project", projectPart); err != nil {
		return "", "", err
	}
	team, project = defaultTeam, defaultProject
	if len(teamPart) > 0 {
		team = string(teamPart)
	}
	if len(projectPart) > 0 {
		project = string(projectPart)
	}
	return team, project, nil
}

// checkProjectPart validates one part of a Compat-Project header; an empty
// part is valid (it means "the default").
func checkProjectPart(what string, part []byte) error {
	if len(part) > maxProjectPart {
		return &ProjectError{Message: "Invalid Compat-Project header: the " + what + " name is longer than 128 characters."}
	}
	for _, c := range part {
		if !isNameByte(c) {
			return &ProjectError{Message: "Invalid Compat-Project header: the " + what + " name may contain only letters, digits, '.', '_' and '-'."}
		}
	}
	return nil
}

func isNameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
}
