package admin

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/auth"
	"github.com/tollgate-dev/tollgate/trace"
)

// EvaluationOpName is the op of an evaluation run's root call.
const EvaluationOpName = "Evaluation.evaluate"

// evaluationOpNames are the op names of a project's evaluation runs: the
// bare name of the runs this service creates, and any version of the op
// ref a Weave SDK logs its Evaluation.evaluate calls under.
func evaluationOpNames(p pathParams) []string {
	return []string{EvaluationOpName, "weave:///" + p.entity + "/" + p.project + "/op/" + EvaluationOpName + ":*"}
}

// isEvaluationRun reports whether a call of the project p is an
// evaluation run's root.
func isEvaluationRun(c *trace.Call, p pathParams) bool {
	if c.OpName == EvaluationOpName {
		return true
	}
	prefix := "weave:///" + p.entity + "/" + p.project + "/op/" + EvaluationOpName + ":"
	return strings.HasPrefix(c.OpName, prefix)
}

// evaluationRunJSON is an evaluation run as read back. evaluation and model
// are the refs the run was created with, usually strings.
type evaluationRunJSON struct {
	EvaluationRunID       string          `json:"evaluation_run_id"`
	Evaluation            json.RawMessage `json:"evaluation"`
	Model                 json.RawMessage `json:"model"`
	Status                string          `json:"status"`
	StartedAt             string          `json:"started_at"`
	FinishedAt            *string         `json:"finished_at"`
	Summary               json.RawMessage `json:"summary"`
	SourceEvaluationRunID *string         `json:"source_evaluation_run_id"`
}

// runAttributes are the attributes an evaluation run's call carries, so
// that a run reads back exactly as created even if its inputs are
// rewritten.
type runAttributes struct {
	EvaluationRun struct {
		Evaluation            string  `json:"evaluation"`
		Model                 string  `json:"model"`
		SourceEvaluationRunID *string `json:"source_evaluation_run_id"`
	} `json:"evaluation_run"`
}

// renderRun reads a run from its root call. Calls ingested by a Weave SDK
// (without the run attributes) read from their inputs.
func renderRun(c *trace.Call) evaluationRunJSON {
	out := evaluationRunJSON{
		EvaluationRunID: c.ID,
		Evaluation:      jsonValue(c.Attributes, "evaluation_run.evaluation", c.Inputs, "self"),
		Model:           jsonValue(c.Attributes, "evaluation_run.model", c.Inputs, "model"),
		Status:          "success",
		StartedAt:       formatTime(c.StartedAt),
		Summary:         orEmptyObject(c.Summary),
	}
	switch {
	case c.EndedAt == nil:
		out.Status = "running"
	case c.Exception != nil:
		out.Status = "error"
	}
	if c.EndedAt != nil {
		s := formatTime(*c.EndedAt)
		out.FinishedAt = &s
	}
	if src := gjson.GetBytes(c.Attributes, "evaluation_run.source_evaluation_run_id"); src.Type == gjson.String {
		s := src.String()
		out.SourceEvaluationRunID = &s
	}
	return out
}

// jsonValue returns the value at path in doc, else at fallbackPath in
// fallback, else null.
func jsonValue(doc []byte, path string, fallback []byte, fallbackPath string) json.RawMessage {
	if r := gjson.GetBytes(doc, path); r.Exists() {
		return json.RawMessage(r.Raw)
	}
	if r := gjson.GetBytes(fallback, fallbackPath); r.Exists() {
		return json.RawMessage(r.Raw)
	}
	return json.RawMessage("null")
}

// createEvaluationRun serves POST /v2/{entity}/{project}/evaluation_runs.
// It does not check that the refs point anywhere, as Weave does not.
func (s *Service) createEvaluationRun(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, p pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), true)
	if e != nil {
		return e
	}
	var v validation
	evaluation, _ := v.reqString(body, "evaluation", bodyLoc)
	model, _ := v.reqString(body, "model", bodyLoc)
	source := v.optString(body, "source_evaluation_run_id", bodyLoc)
	if v.failed() {
		return v.err()
	}
	proj, _, e := s.namedProject(ctx, p.entity, p.project, forWrite)
	if e != nil {
		return e
	}
	u, err := uuid.NewV7()
	if err != nil {
		return internalError(err)
	}
	id := u.String()
	var attrs runAttributes
	attrs.EvaluationRun.Evaluation = evaluation
	attrs.EvaluationRun.Model = model
	attrs.EvaluationRun.SourceEvaluationRunID = source
	user := key.Name
	start := trace.CallStart{
		ProjectID: proj.ID, ID: id, TraceID: id, OpName: EvaluationOpName, StartedAt: time.Now(),
		Attributes: mustJSON(attrs),
		Inputs:     mustJSON(map[string]string{"self": evaluation, "model": model}),
		SvcUserID:  &user,
	}
	if _, e := s.writeCalls(ctx, []trace.CallWrite{{Start: &start}}, [][]any{bodyLoc}); e != nil {
		return e
	}
	writeJSON(rc, fasthttp.StatusOK, map[string]string{"evaluation_run_id": id})
	return nil
}

// readEvaluationRun serves GET /v2/{entity}/{project}/evaluation_runs/{id}.
func (s *Service) readEvaluationRun(ctx context.Context, rc *fasthttp.RequestCtx, _ *auth.Key, p pathParams) *apiError {
	proj, found, e := s.namedProject(ctx, p.entity, p.project, forRead)
	if e != nil {
		return e
	}
	if !found {
		return notFound("Evaluation run")
	}
	c, err := s.store.ReadCall(ctx, proj.ID, p.id)
	if errors.Is(err, trace.ErrNotFound) || (err == nil && !isEvaluationRun(&c, p)) {
		return notFound("Evaluation run")
	}
	if err != nil {
		return internalError(err)
	}
	writeJSON(rc, fasthttp.StatusOK, renderRun(&c))
	return nil
}

// listEvaluationRuns serves GET /v2/{entity}/{project}/evaluation_runs,
// newest first.
func (s *Service) listEvaluationRuns(ctx context.Context, rc *fasthttp.RequestCtx, _ *auth.Key, p pathParams) *apiError {
	limit, offset, e := pageParams(rc)
	if e != nil {
		return e
	}
	proj, found, e := s.namedProject(ctx, p.entity, p.project, forRead)
	if e != nil {
		return e
	}
	var runs []evaluationRunJSON
	if found {
		q := trace.CallsQuery{
			Filter: &trace.CallsFilter{OpNames: evaluationOpNames(p)},
			SortBy: []trace.SortBy{{Field: trace.GetField{Column: "started_at"}, Desc: true}, {Field: trace.GetField{Column: "id"}, Desc: true}},
			Limit:  limit, Offset: offset,
		}
		err := s.store.QueryCalls(ctx, proj.ID, q, func(c *trace.Call) error {
			runs = append(runs, renderRun(c))
			return nil
		})
		if err != nil {
			return internalError(err)
		}
	}
	writeList(rc, runs)
	return nil
}

// SummarizeOpName is the op of the child call that finishing an evaluation
// run logs, as Weave's does.
const SummarizeOpName = "Evaluation.summarize"

// finishEvaluationRun serves POST .../evaluation_runs/{id}/finish with an
// optional body {"summary": {...}, "exception": "..."}. The summary is
// merged into the run's (a JSON merge patch) and becomes the run's output,
// and an Evaluation.summarize child with that output is logged, as Weave
// does. Finishing twice keeps the first finish time and logs no second
// child.
func (s *Service) finishEvaluationRun(ctx context.Context, rc *fasthttp.RequestCtx, key *auth.Key, p pathParams) *apiError {
	body, e := bodyObject(rc.PostBody(), false)
	if e != nil {
		return e
	}
	var v validation
	summary := v.optDict(body, "summary", bodyLoc)
	exception := v.optString(body, "exception", bodyLoc)
	if v.failed() {
		return v.err()
	}
	proj, found, e := s.namedProject(ctx, p.entity, p.project, forRead)
	if e != nil {
		return e
	}
	if !found {
		return notFound("Evaluation run")
	}
	run, err := s.store.ReadCall(ctx, proj.ID, p.id)
	if errors.Is(err, trace.ErrNotFound) || (err == nil && !isEvaluationRun(&run, p)) {
		return notFound("Evaluation run")
	}
	if err != nil {
		return internalError(err)
	}
	now := time.Now()
	if e := lookupError(s.store.FinishCall(ctx, proj.ID, p.id, run.OpName, now, summary, exception), "Evaluation run"); e != nil {
		return e
	}
	if run.EndedAt != nil {
		writeJSON(rc, fasthttp.StatusOK, map[string]bool{"success": true})
		return nil
	}
	output := summary
	if output == nil {
		output = json.RawMessage("{}")
	}
	if err := s.store.SetCallOutput(ctx, proj.ID, p.id, output); err != nil {
		return internalError(err)
	}
	u, err := uuid.NewV7()
	if err != nil {
		return internalError(err)
	}
	user, parent := key.Name, p.id
	start := trace.CallStart{
		ProjectID: proj.ID, ID: u.String(), TraceID: run.TraceID, ParentID: &parent, OpName: SummarizeOpName,
		StartedAt: now, Attributes: json.RawMessage("{}"),
		Inputs:    mustJSON(map[string]json.RawMessage{"self": jsonValue(run.Attributes, "evaluation_run.evaluation", run.Inputs, "self")}),
		SvcUserID: &user,
	}
	end := trace.CallEnd{ProjectID: proj.ID, ID: start.ID, EndedAt: now, Output: output}
	if _, e := s.writeCalls(ctx, []trace.CallWrite{{Start: &start}, {End: &end}}, [][]any{bodyLoc, bodyLoc}); e != nil {
		return e
	}
	writeJSON(rc, fasthttp.StatusOK, map[string]bool{"success": true})
	return nil
}

// deleteEvaluationRuns serves DELETE /v2/{entity}/{project}/evaluation_runs
// ?evaluation_run_ids=a&evaluation_run_ids=b (or a,b) → {"num_deleted"}:
// each run's call goes with all its descendants. Ids that name no run are
// left alone and not counted.
func (s *Service) deleteEvaluationRuns(ctx context.Context, rc *fasthttp.RequestCtx, _ *auth.Key, p pathParams) *apiError {
	var ids []string
	for _, raw := range rc.QueryArgs().PeekMulti("evaluation_run_ids") {
		for _, id := range strings.Split(string(raw), ",") {
			if id = strings.TrimSpace(id); id != "" {
				ids = append(ids, id)
			}
		}
	}
	var v validation
	switch {
	case len(ids) == 0:
		v.add([]any{"query", "evaluation_run_ids"}, "missing", "Field required", nil)
	case len(ids) > maxDeleteCalls:
		v.tooLongList([]any{"query", "evaluation_run_ids"}, len(ids), maxDeleteCalls)
	}
	if v.failed() {
		return v.err()
	}
	proj, found, e := s.namedProject(ctx, p.entity, p.project, forRead)
	if e != nil {
		return e
	}
	var runs []string
	if found {
		q := trace.CallsQuery{Filter: &trace.CallsFilter{CallIDs: ids, OpNames: evaluationOpNames(p)}, Limit: -1}
		if err := s.store.QueryCalls(ctx, proj.ID, q, func(c *trace.Call) error {
			runs = append(runs, c.ID)
			return nil
		}); err != nil {
			return internalError(err)
		}
	}
	if len(runs) > 0 {
		if _, err := s.store.DeleteCalls(ctx, proj.ID, runs); err != nil {
			return internalError(err)
		}
	}
	writeJSON(rc, fasthttp.StatusOK, map[string]int{"num_deleted": len(runs)})
	return nil
}
