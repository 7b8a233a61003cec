package store

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"strings"

	"github.com/tollgate-dev/tollgate/accounting"
)

// usage_rollup is the usage SpentTokens and UsageBuckets read: per second
// a record started in (started_sec, its start in unix nanoseconds
// truncated to a whole unix second, rounded down), team, project, key,
// model, endpoint and status class, the sums of the records there.
// InsertRecords fills it in the transaction that writes the records' calls,
// for a batch it had not marked written before (usage_batches), so that a
// batch the recorder writes again after an ambiguous commit counts once.

// rollupKey is the key of a usage_rollup row.
type rollupKey struct {
	sec                                         int64
	team, project, key, model, endpoint, status string
}

// compare orders keys as the table's primary key does (its text columns
// compare bytewise on both engines), so that every writer upserts rows in
// the same order and two PostgreSQL transactions cannot deadlock on them.
func (k *rollupKey) compare(o *rollupKey) int {
	return cmp.Or(cmp.Compare(k.sec, o.sec),
		strings.Compare(k.team, o.team), strings.Compare(k.project, o.project),
		strings.Compare(k.key, o.key), strings.Compare(k.model, o.model),
		strings.Compare(k.endpoint, o.endpoint), strings.Compare(k.status, o.status))
}

// rollupSums are the sums of a usage_rollup row. Token sums count a
// negative count as 0 and saturate at math.MaxInt64, as sumTokens does.
type rollupSums struct {
	prompt, completion, cached, cacheWrite, total int64
	// spent is what a budget counts of a record: its total, or its prompt
	// and completion tokens when the total is 0 (a proxy leaving the total
	// unset cannot reset a budget).
	spent int64
	// requests counts the records a backend served; records counts all.
	requests, records int64
}

func (s *rollupSums) add(r *accounting.Record) {
	prompt, completion, total := max(r.PromptTokens, 0), max(r.CompletionTokens, 0), max(r.TotalTokens, 0)
	s.prompt = accounting.AddTokens(s.prompt, prompt)
	s.completion = accounting.AddTokens(s.completion, completion)
	s.cached = accounting.AddTokens(s.cached, max(r.CachedTokens, 0))
	s.cacheWrite = accounting.AddTokens(s.cacheWrite, max(r.CacheWriteTokens, 0))
	s.total = accounting.AddTokens(s.total, total)
	if total == 0 {
		total = accounting.AddTokens(prompt, completion)
	}
	s.spent = accounting.AddTokens(s.spent, total)
	if r.Backend != "" {
		s.requests++
	}
	s.records++
}

// usageRollup gathers the rows a batch adds to usage_rollup.
type usageRollup struct {
	sums map[rollupKey]*rollupSums
}

func (u *usageRollup) add(r *accounting.Record) {
	k := rollupKey{
		sec: floorSecond(unixNano(r.Started)), team: r.Team, project: r.Project, key: r.KeyName,
		model: r.Model, endpoint: recordEndpoint(r), status: usageStatus(r.Status, r.Error, r.Incomplete),
	}
	s := u.sums[k]
	if s == nil {
		if u.sums == nil {
			u.sums = make(map[rollupKey]*rollupSums)
		}
		s = new(rollupSums)
		u.sums[k] = s
	}
	s.add(r)
}

// rollupCols3 are the columns usage_rollup was created with (version 3),
// key first, which the migration that created it filled.
const rollupCols3 = `started_sec, team, project, key_name, model, endpoint, status_class,
	prompt_tokens, completion_tokens, cached_tokens, total_tokens, spent_tokens, requests, records`

// rollupCols are the columns of usage_rollup: cache_write_tokens came with
// version 6.
const rollupCols = rollupCols3 + `, cache_write_tokens`

// upsertRollup adds rows to usage_rollup.
var upsertRollup = multiRowInsert{
	head: `INSERT INTO usage_rollup (` + rollupCols + `) VALUES `,
	cols: 15,
	tail: ` ON CONFLICT (started_sec, team, project, key_name, model, endpoint, status_class) DO UPDATE SET
	prompt_tokens = ` + addTokens("usage_rollup.prompt_tokens", "excluded.prompt_tokens") + `,
	completion_tokens = ` + addTokens("usage_rollup.completion_tokens", "excluded.completion_tokens") + `,
	cached_tokens = ` + addTokens("usage_rollup.cached_tokens", "excluded.cached_tokens") + `,
	cache_write_tokens = ` + addTokens("usage_rollup.cache_write_tokens", "excluded.cache_write_tokens") + `,
	total_tokens = ` + addTokens("usage_rollup.total_tokens", "excluded.total_tokens") + `,
	spent_tokens = ` + addTokens("usage_rollup.spent_tokens", "excluded.spent_tokens") + `,
	requests = usage_rollup.requests + excluded.requests,
	records = usage_rollup.records + excluded.records`,
}

// write upserts the gathered rows, in key order.
func (u *usageRollup) write(ctx context.Context, c conn) error {
	if len(u.sums) == 0 {
		return nil
	}
	keys := make([]rollupKey, 0, len(u.sums))
	for k := range u.sums {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b rollupKey) int { return a.compare(&b) })
	return upsertRollup.exec(ctx, c, len(keys), func(args []any, i int) ([]any, error) {
		k := &keys[i]
		s := u.sums[*k]
		return append(args, k.sec, k.team, k.project, k.key, k.model, k.endpoint, k.status,
			s.prompt, s.completion, s.cached, s.total, s.spent, s.requests, s.records, s.cacheWrite), nil
	})
}

// floorSecond is the unix second unix nanoseconds ns fall in, rounded
// down: time.Unix(0, ns).Unix(). floorSecondSQL is the same in SQL.
func floorSecond(ns int64) int64 {
	s := ns / 1e9
	if ns%1e9 < 0 {
		s--
	}
	return s
}

// floorSecondSQL is floorSecond of the column started, in SQL both engines
// run (their integer division truncates towards zero, as Go's does).
const floorSecondSQL = `(CASE WHEN started >= 0 OR started % 1000000000 = 0
	THEN started / 1000000000 ELSE started / 1000000000 - 1 END)`

// ceilSecond is the first unix second whose start is at or after unix
// nanoseconds ns: a record started in second s is at or after ns, to the
// roll-up's resolution, when s >= ceilSecond(ns).
func ceilSecond(ns int64) int64 {
	s := ns / 1e9
	if ns%1e9 > 0 {
		s++
	}
	return s
}

// statusRule is one case of a record's status class: a record matches
// when it satisfies every condition the rule sets.
type statusRule struct {
	class      string
	incomplete bool   // the record is incomplete
	errPrefix  string // its error starts with errPrefix
	noError    bool   // its error is empty
	from, to   int    // its status is at least from (if set), below to (if set)
}

// usageStatusRules class a record by its outcome, as
// accounting.UsageStatuses names them: the first rule it matches names its
// class, and a record matching none is a server_error. The order matters:
// a client that closed a stream left status 200 and an error behind, and
// a stream the backend broke off kept its 200 too, so incomplete records
// are classed before their status is read. The proxy describes a stream
// its client closed with an error that starts "client closed"
// (proxy/stream.go); a request whose client left before any answer has
// nginx's 499.
//
// usageStatus applies them to a record, for InsertRecords;
// usageStatusSQL is the same in SQL, for the migration that fills the
// roll-up from the records stored before it.
var usageStatusRules = []statusRule{
	{class: "client_closed", from: 499, to: 500},
	{class: "client_closed", incomplete: true, errPrefix: "client closed"},
	{class: "stream_broken", incomplete: true},
	{class: "server_error", from: 500},
	{class: "client_error", from: 400},
	{class: "complete", from: 200, to: 300, noError: true},
}

// usageStatusOther is the class of a record no rule matches.
const usageStatusOther = "server_error"

func (r *statusRule) matches(status int, errText string, incomplete bool) bool {
	return (!r.incomplete || incomplete) && strings.HasPrefix(errText, r.errPrefix) &&
		(!r.noError || errText == "") &&
		(r.from == 0 || status >= r.from) && (r.to == 0 || status < r.to)
}

// sql is r's condition in SQL both engines run: incomplete is an INTEGER
// on SQLite and a BOOLEAN on PostgreSQL, and either is a condition as it
// stands; the prefix is compared with substr, which is bytewise on both
// (SQLite's LIKE ignores ASCII case).
func (r *statusRule) sql() string {
	var conds []string
	if r.incomplete {
		conds = append(conds, "incomplete")
	}
	if r.errPrefix != "" {
		conds = append(conds, "substr(error, 1, "+strconv.Itoa(len(r.errPrefix))+") = "+sqlString(r.errPrefix))
	}
	if r.noError {
		conds = append(conds, "error = ''")
	}
	if r.from != 0 {
		conds = append(conds, "status >= "+strconv.Itoa(r.from))
	}
	if r.to != 0 {
		conds = append(conds, "status < "+strconv.Itoa(r.to))
	}
	return strings.Join(conds, " AND ")
}

// usageStatus is the class of a record with status, errText and
// incomplete.
func usageStatus(status int, errText string, incomplete bool) string {
	for i := range usageStatusRules {
		if usageStatusRules[i].matches(status, errText, incomplete) {
			return usageStatusRules[i].class
		}
	}
	return usageStatusOther
}

// usageStatusSQL is usageStatus of a usage_records row, for migration 3.
func usageStatusSQL() string {
	var sb strings.Builder
	sb.WriteString("(CASE")
	for i := range usageStatusRules {
		sb.WriteString(" WHEN " + usageStatusRules[i].sql() + " THEN " + sqlString(usageStatusRules[i].class))
	}
	sb.WriteString(" ELSE " + sqlString(usageStatusOther) + " END)")
	return sb.String()
}

// sqlString is s as an SQL string literal.
func sqlString(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// fillRollupSQL is the migration statement that fills usage_rollup from
// every record in usage_records, with the sums InsertRecords keeps.
func fillRollupSQL(d dialect) string {
	// spent is summed in three parts added saturating, as rollupSums.add
	// adds it: adding prompt and completion tokens row by row could
	// overflow before any sum saw them.
	spentTotal := d.sumTokens("total_tokens")
	spentPrompt := d.sumTokens("CASE WHEN total_tokens > 0 THEN 0 ELSE prompt_tokens END")
	spentCompletion := d.sumTokens("CASE WHEN total_tokens > 0 THEN 0 ELSE completion_tokens END")
	return `INSERT INTO usage_rollup (` + rollupCols3 + `)
	SELECT ` + floorSecondSQL + `, team, project, key_name, model, endpoint, ` + usageStatusSQL() + `, ` +
		d.sumTokens("prompt_tokens") + `, ` + d.sumTokens("completion_tokens") + `, ` +
		d.sumTokens("cached_tokens") + `, ` + d.sumTokens("total_tokens") + `, ` +
		addTokens(spentTotal, addTokens(spentPrompt, spentCompletion)) + `,
		SUM(CASE WHEN backend <> '' THEN 1 ELSE 0 END), COUNT(*)
	FROM usage_records
	GROUP BY 1, 2, 3, 4, 5, 6, 7`
}
