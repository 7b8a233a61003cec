package accounting

import "time"

// The usage API sums usage records: UsageQuery selects them and UsageRow
// is one sum. They live beside Record so that the store that sums records
// and the HTTP API that asks for sums share them without depending on
// each other.

// UsageQuery selects the usage records one page of the usage API sums.
type UsageQuery struct {
	// Start and End bound the records' start times: [Start, End).
	Start, End time.Time
	// BucketWidth splits [Start, End) into buckets, the first at Start.
	BucketWidth time.Duration
	// GroupByProject, GroupByModel, GroupByKey, GroupByEndpoint and
	// GroupByStatus split each bucket's sums by team and project, by model,
	// by key name, by endpoint, and by outcome (UsageStatuses).
	GroupByProject, GroupByModel, GroupByKey, GroupByEndpoint, GroupByStatus bool
	// Projects, when not empty, keeps only these projects.
	Projects []UsageProject
	// Models, when not empty, keeps only these (requested) models.
	Models []string
	// Endpoints, when not empty, keeps only the records of these endpoints
	// (Endpoints lists their names); empty keeps every endpoint.
	Endpoints []string
	// Teams, when not nil, keeps only these teams: the caller's own. A
	// non-nil empty slice selects nothing.
	Teams []string
}

// UsageProject is a team's project, "team/project" in the usage API.
type UsageProject struct {
	Team, Project string
}

// UsageRow is the usage of one group in one bucket. The group fields not
// grouped by are empty.
type UsageRow struct {
	BucketStart time.Time
	Team        string
	Project     string
	Model       string
	KeyName     string
	Endpoint    string
	// Status is the records' outcome, one of UsageStatuses.
	Status string

	// InputTokens are prompt tokens, cached ones included, as OpenAI counts them.
	InputTokens  int64
	OutputTokens int64
	CachedTokens int64
	// CacheWriteTokens are the input tokens written to the backend's
	// prompt cache (Record.CacheWriteTokens), part of InputTokens.
	CacheWriteTokens int64
	// Requests counts the records a backend was reached for (OpenAI's
	// num_model_requests); Records counts every record, those refused
	// before any backend (a limit, a bad request) included.
	Requests int64
	Records  int64
}

// UsageEndpoints are the endpoints usage records tell apart, as
// accounting.Record.Endpoint names them: the usage API's endpoints= and
// group_by=endpoint values.
func UsageEndpoints() []string {
	return []string{"chat.completions", "completions", "embeddings", "responses", "messages", "messages.count_tokens"}
}

// UsageStatuses are the outcomes group_by=status tells apart, in the
// order the store sorts them:
//   - client_closed: the client left before the end, either closing a
//     stream (its tokens are what was streamed until then) or giving up
//     before any answer (status 499);
//   - client_error: refused with a 4xx as the client's fault (bad request,
//     key, limit), 499 aside;
//   - complete: answered in full (a 2xx without error);
//   - server_error: the gateway or a backend failed: a 5xx, or a stream
//     that ended in an in-band error after its 200;
//   - stream_broken: the backend broke a stream off after its first byte
//     (its tokens are what was streamed until then).
//
// client_closed streams and stream_broken are the incomplete (aborted)
// requests.
func UsageStatuses() []string {
	return []string{"client_closed", "client_error", "complete", "server_error", "stream_broken"}
}
