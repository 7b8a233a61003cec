package store

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/tollgate-dev/tollgate/accounting"
)

// gatewayOpName is the op of the call the gateway records for a request to
// endpoint ("chat.completions", "embeddings", ...; empty for records made
// before endpoints were told apart, which were chat completions): the name
// Weave's OpenAI integration gives the SDK method, such as
// "openai.chat.completions.create" or "openai.embeddings.create". The
// known endpoints' names are constants, so that no record builds one.
func gatewayOpName(endpoint string) string {
	switch endpoint {
	case "", "chat.completions":
		return "openai.chat.completions.create"
	case "completions":
		return "openai.completions.create"
	case "embeddings":
		return "openai.embeddings.create"
	case "responses":
		return "openai.responses.create"
	}
	return "openai." + endpoint + ".create"
}

// Fallbacks for a record without a team or project. The proxy applies the
// configured defaults before recording, so these only keep such a record
// reachable rather than filed under an empty entity.
const (
	fallbackTeam    = "default"
	fallbackProject = "inference"
)

// insertGatewayCall leaves a call that exists already alone, so that a
// retried batch inserts nothing twice.
var insertGatewayCall = multiRowInsert{
	head: `INSERT INTO calls (project_id, id, op_name, trace_id, parent_id, started_at, ended_at, exception,
		attributes, inputs, output, summary, svc_user_id)
	VALUES `,
	cols: 13,
	tail: ` ON CONFLICT (project_id, id) DO NOTHING`,
}

// gatewayAttributes are the attributes of a gateway call.
type gatewayAttributes struct {
	RequestID   string `json:"request_id"`
	KeyName     string `json:"key_name"`
	Backend     string `json:"backend"`
	Status      int    `json:"status"`
	Stream      bool   `json:"stream"`
	Incomplete  bool   `json:"incomplete"`
	ServedModel string `json:"served_model"`
	// CompletionID is the reply's id, by which, with the reply's date, an
	// SDK's call of the same completion finds this one (see
	// call_completions.go).
	CompletionID string `json:"completion_id,omitempty"`
}

// gatewayAttributesJSON is the attributes of a record's call, as JSON.
func gatewayAttributesJSON(rec *accounting.Record) ([]byte, error) {
	return json.Marshal(gatewayAttributes{
		RequestID: rec.RequestID, KeyName: rec.KeyName, Backend: rec.Backend, Status: rec.Status,
		Stream: rec.Stream, Incomplete: rec.Incomplete, ServedModel: rec.ServedModel, CompletionID: rec.CompletionID,
	})
}

// modelUsage is one model's entry of summary.usage, in the Weave shape the
// trace usage roll-up reads: {"usage": {"<model>": modelUsage}}.
type modelUsage struct {
	Requests             int64 `json:"requests"`
	PromptTokens         int64 `json:"prompt_tokens"`
	CompletionTokens     int64 `json:"completion_tokens"`
	TotalTokens          int64 `json:"total_tokens"`
	CacheReadInputTokens int64 `json:"cache_read_input_tokens"`
}

// insertGatewayCalls records each chat completion as a trace call in the
// same transaction as its usage record. A call that exists already is left
// alone, so that a retried batch inserts nothing twice.
func insertGatewayCalls(ctx context.Context, c conn, recs []accounting.Record) error {
	if len(recs) == 0 {
		return nil
	}
	projects, err := ensureRecordProjects(ctx, c, recs)
	if err != nil {
		return fmt.Errorf("insert gateway calls: %w", err)
	}
	for i := range recs {
		if recs[i].CallID == "" {
			// The proxy always sets it; a generated id keeps a record that
			// lacks one from colliding with another.
			u, err := uuid.NewV7()
			if err != nil {
				return fmt.Errorf("insert gateway calls: %w", err)
			}
			recs[i].CallID = u.String()
		}
	}
	err = insertGatewayCall.exec(ctx, c, len(recs), func(args []any, i int) ([]any, error) {
		rec := &recs[i]
		args, err := appendGatewayCallArgs(args, projects[recordProject(rec)], rec)
		if err != nil {
			return nil, fmt.Errorf("call %s: %w", rec.CallID, err)
		}
		return args, nil
	})
	if err != nil {
		return fmt.Errorf("insert gateway calls: %w", err)
	}
	// Last, so that the links' row locks are taken after every statement
	// that may need a connection of the pool (see linkGatewayCompletions).
	if err := linkGatewayCompletions(ctx, c, recs, projects); err != nil {
		return fmt.Errorf("insert gateway calls: %w", err)
	}
	return nil
}

// recordProject is the team and project a record's call is filed under.
func recordProject(rec *accounting.Record) [2]string {
	team, project := rec.Team, rec.Project
	if team == "" {
		team = fallbackTeam
	}
	if project == "" {
		project = fallbackProject
	}
	return [2]string{team, project}
}

// ensureRecordProjects returns the id of every project recs are filed
// under, creating the missing ones in (team, project) order: on
// PostgreSQL, two writers creating the same new projects then wait for one
// another in the same order rather than deadlock.
func ensureRecordProjects(ctx context.Context, c conn, recs []accounting.Record) (map[[2]string]int64, error) {
	var names [][2]string
	seen := make(map[[2]string]bool)
	for i := range recs {
		tp := recordProject(&recs[i])
		if !seen[tp] {
			seen[tp] = true
			names = append(names, tp)
		}
	}
	slices.SortFunc(names, func(a, b [2]string) int {
		return cmp.Or(strings.Compare(a[0], b[0]), strings.Compare(a[1], b[1]))
	})
	ids := make(map[[2]string]int64, len(names))
	for _, tp := range names {
		id, err := ensureProject(ctx, c, tp[0], tp[1])
		if err != nil {
			return nil, err
		}
		ids[tp] = id
	}
	return ids, nil
}

// appendGatewayCallArgs appends a record's row of insertGatewayCall to args.
func appendGatewayCallArgs(args []any, projectID int64, rec *accounting.Record) ([]any, error) {
	id, trace := rec.CallID, rec.TraceID
	if id == "" {
		// The proxy always sets both; a generated id keeps a record that
		// lacks one from colliding with another.
		u, err := uuid.NewV7()
		if err != nil {
			return nil, err
		}
		id = u.String()
	}
	if trace == "" {
		trace = id
	}
	var parent, exception any
	if rec.ParentID != "" {
		parent = rec.ParentID
	}
	if rec.Error != "" {
		exception = rec.Error
	}
	ended := rec.Ended
	if ended.IsZero() {
		ended = rec.Started
	}
	attrs, err := gatewayAttributesJSON(rec)
	if err != nil {
		return nil, err
	}
	summary, err := gatewaySummary(rec)
	if err != nil {
		return nil, err
	}
	inputs := "{}"
	if len(rec.Input) > 0 {
		inputs = payloadObject(rec.Input)
	}
	var output any
	if len(rec.Output) > 0 {
		output = payloadValue(rec.Output)
	}
	var user any
	if rec.KeyName != "" {
		user = rec.KeyName
	}
	return append(args, projectID, id, gatewayOpName(rec.Endpoint), trace, parent, formatTraceTime(rec.Started), formatTraceTime(ended), exception,
		string(attrs), inputs, output, summary, user), nil
}

// gatewaySummary is the summary of a record's call:
// {"usage":{"<model>":<modelUsage>}}. The model is a key only JSON can
// quote; the rest is a struct, so no map is built per record.
func gatewaySummary(rec *accounting.Record) (string, error) {
	model, err := json.Marshal(rec.Model)
	if err != nil {
		return "", err
	}
	usage, err := json.Marshal(modelUsage{
		Requests: 1, PromptTokens: rec.PromptTokens, CompletionTokens: rec.CompletionTokens,
		TotalTokens: rec.TotalTokens, CacheReadInputTokens: rec.CachedTokens,
	})
	if err != nil {
		return "", err
	}
	b := make([]byte, 0, len(`{"usage":{:}}`)+len(model)+len(usage))
	b = append(b, `{"usage":{`...)
	b = append(b, model...)
	b = append(b, ':')
	b = append(b, usage...)
	b = append(b, "}}"...)
	return string(b), nil
}

// payloadValue returns b as JSON text: itself when it is JSON (the reply
// body), else a JSON string of it (the concatenated text of a stream).
func payloadValue(b []byte) string {
	if json.Valid(b) {
		var buf bytes.Buffer
		if err := json.Compact(&buf, b); err == nil {
			return buf.String()
		}
	}
	s, err := json.Marshal(string(b))
	if err != nil {
		return "null"
	}
	return string(s)
}

// payloadObject returns b as a JSON object for inputs: the request body
// itself when it is one, else {"body": <b as payloadValue>}.
func payloadObject(b []byte) string {
	v := payloadValue(b)
	if len(v) > 0 && v[0] == '{' {
		return v
	}
	return `{"body":` + v + `}`
}
