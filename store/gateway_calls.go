package store

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/internal/jsonstr"
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
	case "messages":
		// The name Weave's Anthropic integration gives the SDK method.
		return "anthropic.Messages.create"
	case "messages.count_tokens":
		return "anthropic.Messages.count_tokens"
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
		attributes, inputs, output, summary, svc_user_id, completion_created)
	VALUES `,
	cols: 14,
	tail: ` ON CONFLICT (project_id, id) DO NOTHING`,
}

// appendGatewayAttributes appends the attributes of a record's call, as
// JSON: request_id, key_name, backend, status, stream, incomplete,
// served_model and, when the reply had one, completion_id (the reply's id,
// by which, with the reply's date, an SDK's call of the same completion
// finds this one; see call_completions.go). The keys and their order are
// those the calls stored so far have, which json.Marshal of a struct wrote.
func appendGatewayAttributes(b []byte, rec *accounting.Record) []byte {
	b = append(b, `{"request_id":`...)
	b = jsonstr.Append(b, rec.RequestID)
	b = append(b, `,"key_name":`...)
	b = jsonstr.Append(b, rec.KeyName)
	b = append(b, `,"backend":`...)
	b = jsonstr.Append(b, rec.Backend)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(rec.Status), 10)
	b = append(b, `,"stream":`...)
	b = strconv.AppendBool(b, rec.Stream)
	b = append(b, `,"incomplete":`...)
	b = strconv.AppendBool(b, rec.Incomplete)
	b = append(b, `,"served_model":`...)
	b = jsonstr.Append(b, rec.ServedModel)
	if rec.CompletionID != "" {
		b = append(b, `,"completion_id":`...)
		b = jsonstr.Append(b, rec.CompletionID)
	}
	return append(b, '}')
}

// appendGatewaySummary appends the summary of a record's call:
// {"usage":{"<model>":{...}}}, the Weave shape the trace usage roll-up
// reads, with the keys in the order the calls stored so far have them;
// cache_creation_input_tokens (the record's CacheWriteTokens, part of its
// prompt_tokens), named as Weave's Anthropic integration names it, only
// when the backend reported cache writes, so that the summaries of every
// other call keep their bytes.
func appendGatewaySummary(b []byte, rec *accounting.Record) []byte {
	b = append(b, `{"usage":{`...)
	b = jsonstr.Append(b, rec.Model)
	b = append(b, `:{"requests":1,"prompt_tokens":`...)
	b = strconv.AppendInt(b, rec.PromptTokens, 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, rec.CompletionTokens, 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, rec.TotalTokens, 10)
	b = append(b, `,"cache_read_input_tokens":`...)
	b = strconv.AppendInt(b, rec.CachedTokens, 10)
	if rec.CacheWriteTokens != 0 {
		b = append(b, `,"cache_creation_input_tokens":`...)
		b = strconv.AppendInt(b, rec.CacheWriteTokens, 10)
	}
	return append(b, "}}}"...)
}

// gatewayProject is a project a batch's calls are filed under, with the
// arguments that name it boxed once for all of the batch's rows.
type gatewayProject struct {
	team   string
	entity any // team, the link's entity
	id     int64
	idArg  any // id
}

// gatewayRow is what a record's call row and link are built from,
// computed once per record of a batch.
type gatewayRow struct {
	project *gatewayProject
	callID  any // the record's CallID, boxed once for the call and its link
	// created is the record's CompletionCreated, boxed once for each run
	// of equal dates, for the call's completion_created and its link;
	// nil when the record has no completion id.
	created any
	// text bounds the call's started_at, ended_at, attributes and summary
	// in the batch's text: text[k]:text[k+1].
	text [5]int
}

// gatewayRowText is an estimate of the text of a record's call beyond its
// strings: its two times and the JSON around the attributes and summary.
const gatewayRowText = 320

// gatewayCacheWriteText is the most text a record's cache writes add to
// its summary: the key and a count of up to 20 digits.
const gatewayCacheWriteText = len(`,"cache_creation_input_tokens":`) + 20

// gatewayCallRows returns the rows of recs' calls and the text they
// bound. All of a batch's text is one string, built through one reused
// buffer, so that a record's four texts cost no allocation of their own;
// each argument is still boxed.
func gatewayCallRows(recs []accounting.Record, projects map[[2]string]*gatewayProject) ([]gatewayRow, string) {
	rows := make([]gatewayRow, len(recs))
	size := 0
	for i := range recs {
		rec := &recs[i]
		size += gatewayRowText + len(rec.RequestID) + len(rec.KeyName) + len(rec.Backend) + len(rec.ServedModel) +
			len(rec.CompletionID) + len(rec.Model)
		if rec.CacheWriteTokens != 0 {
			size += gatewayCacheWriteText
		}
	}
	var text strings.Builder
	text.Grow(size)
	var buf []byte
	var created any
	for i := range recs {
		rec, row := &recs[i], &rows[i]
		row.project = projects[recordProject(rec)]
		row.callID = rec.CallID
		if rec.CompletionID != "" {
			if c, ok := created.(int64); !ok || c != rec.CompletionCreated {
				created = rec.CompletionCreated
			}
			row.created = created
		}
		ended := rec.Ended
		if ended.IsZero() {
			ended = rec.Started
		}
		base := text.Len()
		row.text[0] = base
		buf = appendTraceTime(buf[:0], rec.Started)
		row.text[1] = base + len(buf)
		buf = appendTraceTime(buf, ended)
		row.text[2] = base + len(buf)
		buf = appendGatewayAttributes(buf, rec)
		row.text[3] = base + len(buf)
		buf = appendGatewaySummary(buf, rec)
		row.text[4] = base + len(buf)
		text.Write(buf)
	}
	return rows, text.String()
}

// lastArg boxes a string argument once for each run of equal values: a
// batch's records mostly share their endpoint and key name.
type lastArg struct {
	s string
	v any
}

func (l *lastArg) box(s string) any {
	if l.v == nil || s != l.s {
		l.s, l.v = s, s
	}
	return l.v
}

// insertGatewayCalls records each request as a trace call, the one row a
// request has (its usage is summed in the roll-up in the same transaction).
// Every record has its call id (fillCallIDs). A call that exists already
// is left alone, so that a retried batch inserts nothing twice. numbered
// lets SQLite statements bind fewer values (gatewayCallShapes); without
// it every statement binds every value, as PostgreSQL's do.
func insertGatewayCalls(ctx context.Context, c conn, recs []accounting.Record, numbered bool) error {
	if len(recs) == 0 {
		return nil
	}
	projects, err := ensureRecordProjects(ctx, c, recs)
	if err != nil {
		return fmt.Errorf("insert gateway calls: %w", err)
	}
	rows, text := gatewayCallRows(recs, projects)
	var op, user lastArg
	if numbered {
		err = insertNumberedGatewayCalls(ctx, c, recs, rows, text)
	} else {
		err = insertGatewayCall.exec(ctx, c, len(recs), func(args []any, i int) ([]any, error) {
			return appendGatewayCallArgs(args, &recs[i], &rows[i], text, &op, &user), nil
		})
	}
	if err != nil {
		return fmt.Errorf("insert gateway calls: %w", err)
	}
	// Last, so that the links' row locks are taken after every statement
	// that may need a connection of the pool (see linkGatewayCompletions).
	if err := linkGatewayCompletions(ctx, c, recs, rows, text, numbered); err != nil {
		return fmt.Errorf("insert gateway calls: %w", err)
	}
	return nil
}

// gatewayCallShapes are the rows of insertGatewayCall's statements on
// SQLite (see numberedRow), by the sum of the gatewayCall flags every row
// of the statement fits: a plain row is a call with no parent, no
// exception and no stored payloads, as nearly every request is, which
// binds 10 values rather than 14; the shared ones bind a value of the
// first row once for all: its project and op name, its svc_user_id (the
// key name), its completion_created (the reply's second, which a
// statement's completions mostly share). Each is a flag of its own
// because they vary apart: a project's requests come through several
// keys as often as through one. A statement takes the shape every one of
// its rows fits, so that a batch runs at most 16 x 7 statement shapes,
// each prepared on first use, and rows in the order of recs.
var gatewayCallShapes = func() (shapes [16]*numberedInsert) {
	for flags := range shapes {
		row := numberedRow{"?", "?", "?", "?", "?", "?", "?", "?", "?", "?", "?", "?", "?", "?"}
		if flags&gatewayCallPlain != 0 {
			row[4], row[7], row[9], row[10] = "NULL", "NULL", "'{}'", "NULL"
		}
		if flags&gatewayCallSharedProjectOp != 0 {
			row[0], row[2] = "^0", "^2"
		}
		if flags&gatewayCallSharedUser != 0 {
			row[12] = "^12"
		}
		if flags&gatewayCallSharedCreated != 0 {
			row[13] = "^13"
		}
		shapes[flags] = newNumberedInsert(insertGatewayCall, row)
	}
	return shapes
}()

// The flags of gatewayCallShapes.
const (
	gatewayCallPlain = 1 << iota
	gatewayCallSharedProjectOp
	gatewayCallSharedUser
	gatewayCallSharedCreated
)

// plainGatewayCall reports whether rec's call fits a plain row of
// gatewayCallShapes: its parent, exception and output NULL and its inputs
// {} (see gatewayCallValues).
func plainGatewayCall(rec *accounting.Record) bool {
	return rec.ParentID == "" && rec.Error == "" && len(rec.Input) == 0 && len(rec.Output) == 0
}

// insertNumberedGatewayCalls is insertGatewayCall on SQLite, in statements
// of gatewayCallShapes, split as multiRowInsert.exec splits them.
func insertNumberedGatewayCalls(ctx context.Context, c conn, recs []accounting.Record, rows []gatewayRow, text string) error {
	var op, user lastArg
	args := make([]any, 0, min(len(recs), rowsPerInsert)*insertGatewayCall.cols)
	for start := 0; start < len(recs); {
		n := statementRows(len(recs) - start)
		shape := gatewayCallShapes[gatewayCallFlags(recs[start:start+n], rows[start:start+n])]
		args = args[:0]
		for i := start; i < start+n; i++ {
			var vals [14]any
			args = shape.row.values(args, appendGatewayCallArgs(vals[:0], &recs[i], &rows[i], text, &op, &user), i == start)
		}
		_, err := execCached(ctx, c, shape.sql(n), args)
		yieldBetweenStatements()
		if err != nil {
			return fmt.Errorf("rows %d to %d: %w", start, start+n-1, err)
		}
		start += n
	}
	return nil
}

// gatewayCallFlags are the flags of gatewayCallShapes that every one of
// recs' calls fits; rows are recs' gatewayRows.
func gatewayCallFlags(recs []accounting.Record, rows []gatewayRow) int {
	plain, shared, sharedUser, sharedCreated := true, true, true, true
	firstOp := gatewayOpName(recs[0].Endpoint)
	for i := range recs {
		plain = plain && plainGatewayCall(&recs[i])
		shared = shared && rows[i].project == rows[0].project && gatewayOpName(recs[i].Endpoint) == firstOp
		// Equal key names are equal values: NULL for "" (appendGatewayCallArgs).
		sharedUser = sharedUser && recs[i].KeyName == recs[0].KeyName
		// nil, without a completion id, or the same int64.
		sharedCreated = sharedCreated && rows[i].created == rows[0].created
	}
	return b2i(plain)*gatewayCallPlain + b2i(shared)*gatewayCallSharedProjectOp +
		b2i(sharedUser)*gatewayCallSharedUser + b2i(sharedCreated)*gatewayCallSharedCreated
}

// b2i is 1 for true, 0 for false.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
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

// ensureRecordProjects returns every project recs are filed under,
// creating the missing ones in (team, project) order: on PostgreSQL, two
// writers creating the same new projects then wait for one another in the
// same order rather than deadlock.
func ensureRecordProjects(ctx context.Context, c conn, recs []accounting.Record) (map[[2]string]*gatewayProject, error) {
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
	projects := make(map[[2]string]*gatewayProject, len(names))
	for _, tp := range names {
		id, err := ensureProject(ctx, c, tp[0], tp[1])
		if err != nil {
			return nil, err
		}
		projects[tp] = &gatewayProject{team: tp[0], entity: tp[0], id: id, idArg: id}
	}
	return projects, nil
}

// gatewayCallValues appends a record's row of insertGatewayCall to
// vals; row and text are the record's of gatewayCallRows, op and user box
// the op name and key name across the batch's rows.
func appendGatewayCallArgs(args []any, rec *accounting.Record, row *gatewayRow, text string, op, user *lastArg) []any {
	traceID := row.callID
	if rec.TraceID != "" && rec.TraceID != rec.CallID {
		traceID = rec.TraceID
	}
	var parent, exception any
	if rec.ParentID != "" {
		parent = rec.ParentID
	}
	if rec.Error != "" {
		exception = rec.Error
	}
	var inputs any = "{}"
	if len(rec.Input) > 0 {
		inputs = payloadObject(rec.Input)
	}
	var output any
	if len(rec.Output) > 0 {
		output = payloadValue(rec.Output)
	}
	var keyName any
	if rec.KeyName != "" {
		keyName = user.box(rec.KeyName)
	}
	t := &row.text
	return append(args, row.project.idArg, row.callID, op.box(gatewayOpName(rec.Endpoint)), traceID, parent,
		text[t[0]:t[1]], text[t[1]:t[2]], exception, text[t[2]:t[3]], inputs, output, text[t[3]:t[4]], keyName,
		row.created)
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
