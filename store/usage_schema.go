package store

// usageMigrations version the usage records schema.
//
// usage_records holds every field of accounting.Record except the payloads
// (Input, Output), which belong to traces, one row per record: the durable
// log of every request, which outlives the deletion of its trace calls and
// from which usage_rollup can always be rebuilt. Times are unix
// nanoseconds. call_id is the key: it is unique per completion, while
// request_id may repeat when a client reuses its X-Request-Id.
//
// usage_rollup (version 3, see usage_rollup.go) is what the reads use: the
// sums of the records per second, team, project, key, model, endpoint and
// status class, filled by InsertRecords from the records its INSERT
// inserted, in the same transaction.
//
// Indexes, the same on both engines:
//   - usage_records, primary key (call_id): the idempotent insert (ON
//     CONFLICT DO NOTHING), whose count of inserted rows, or for a batch
//     written again its RETURNING, tells InsertRecords which records are
//     new to the roll-up. The proxy's call ids are UUIDv7, so inserts
//     append. Nothing reads usage_records by another column.
//   - usage_rollup, primary key (started_sec, team, project, key_name,
//     model, endpoint, status_class): the upsert of each batch's rows, and
//     the time range SpentTokens and UsageBuckets scan; the time first
//     keeps a batch's upserts at the end of the tree. On SQLite it is
//     WITHOUT ROWID, one tree instead of a table and its key's index.
//
// On PostgreSQL, text columns use the "C" collation, so that ORDER BY and
// comparisons are bytewise as in SQLite whatever the database's locale;
// stream and incomplete are BOOLEAN.
//
// Version 1 indexed usage_records by started, by (team, project,
// started), by (model, started) and by request_id, for reads that now go
// to usage_rollup (request_id had no reader); version 3 drops them: in
// BenchmarkInsertRecords they were about 7 % of the writer's instructions
// on SQLite, where the roll-up costs less than 1 %.
//
// Version 2 adds endpoint, the OpenAI endpoint of the record
// ("chat.completions", "completions", "embeddings", "responses"); rows
// written before it are chat completions, which its default says.
//
// Version 3 creates usage_rollup and fills it from the records already
// stored (fillRollupSQL, with the classes and saturating sums InsertRecords
// keeps), and drops the indexes above.
var usageMigrations = []migration{
	{
		component: "usage",
		version:   1,
		sqlite: []string{
			`CREATE TABLE usage_records (
				call_id           TEXT    NOT NULL PRIMARY KEY,
				request_id        TEXT    NOT NULL,
				trace_id          TEXT    NOT NULL,
				parent_id         TEXT    NOT NULL DEFAULT '',
				key_name          TEXT    NOT NULL,
				team              TEXT    NOT NULL,
				project           TEXT    NOT NULL,
				model             TEXT    NOT NULL,
				served_model      TEXT    NOT NULL DEFAULT '',
				backend           TEXT    NOT NULL DEFAULT '',
				status            INTEGER NOT NULL,
				error             TEXT    NOT NULL DEFAULT '',
				stream            INTEGER NOT NULL DEFAULT 0,
				incomplete        INTEGER NOT NULL DEFAULT 0,
				prompt_tokens     INTEGER NOT NULL DEFAULT 0,
				completion_tokens INTEGER NOT NULL DEFAULT 0,
				total_tokens      INTEGER NOT NULL DEFAULT 0,
				cached_tokens     INTEGER NOT NULL DEFAULT 0,
				started           INTEGER NOT NULL,
				ended             INTEGER NOT NULL
			)`,
			`CREATE INDEX usage_records_started ON usage_records (started)`,
			`CREATE INDEX usage_records_team_project_started ON usage_records (team, project, started)`,
			`CREATE INDEX usage_records_model_started ON usage_records (model, started)`,
			`CREATE INDEX usage_records_request_id ON usage_records (request_id)`,
		},
		postgres: []string{
			`CREATE TABLE usage_records (
				call_id           TEXT COLLATE "C" NOT NULL PRIMARY KEY,
				request_id        TEXT COLLATE "C" NOT NULL,
				trace_id          TEXT COLLATE "C" NOT NULL,
				parent_id         TEXT COLLATE "C" NOT NULL DEFAULT '',
				key_name          TEXT COLLATE "C" NOT NULL,
				team              TEXT COLLATE "C" NOT NULL,
				project           TEXT COLLATE "C" NOT NULL,
				model             TEXT COLLATE "C" NOT NULL,
				served_model      TEXT COLLATE "C" NOT NULL DEFAULT '',
				backend           TEXT COLLATE "C" NOT NULL DEFAULT '',
				status            INTEGER NOT NULL,
				error             TEXT    NOT NULL DEFAULT '',
				stream            BOOLEAN NOT NULL DEFAULT FALSE,
				incomplete        BOOLEAN NOT NULL DEFAULT FALSE,
				prompt_tokens     BIGINT  NOT NULL DEFAULT 0,
				completion_tokens BIGINT  NOT NULL DEFAULT 0,
				total_tokens      BIGINT  NOT NULL DEFAULT 0,
				cached_tokens     BIGINT  NOT NULL DEFAULT 0,
				started           BIGINT  NOT NULL,
				ended             BIGINT  NOT NULL
			)`,
			`CREATE INDEX usage_records_started ON usage_records (started)`,
			`CREATE INDEX usage_records_team_project_started ON usage_records (team, project, started)`,
			`CREATE INDEX usage_records_model_started ON usage_records (model, started)`,
			`CREATE INDEX usage_records_request_id ON usage_records (request_id)`,
		},
	},
	{
		component: "usage",
		version:   2,
		sqlite: []string{
			`ALTER TABLE usage_records ADD COLUMN endpoint TEXT NOT NULL DEFAULT 'chat.completions'`,
		},
		postgres: []string{
			`ALTER TABLE usage_records ADD COLUMN endpoint TEXT COLLATE "C" NOT NULL DEFAULT 'chat.completions'`,
		},
	},
	{
		component: "usage",
		version:   3,
		sqlite: []string{
			`CREATE TABLE usage_rollup (
				started_sec       INTEGER NOT NULL,
				team              TEXT    NOT NULL,
				project           TEXT    NOT NULL,
				key_name          TEXT    NOT NULL,
				model             TEXT    NOT NULL,
				endpoint          TEXT    NOT NULL,
				status_class      TEXT    NOT NULL,
				prompt_tokens     INTEGER NOT NULL,
				completion_tokens INTEGER NOT NULL,
				cached_tokens     INTEGER NOT NULL,
				total_tokens      INTEGER NOT NULL,
				spent_tokens      INTEGER NOT NULL,
				requests          INTEGER NOT NULL,
				records           INTEGER NOT NULL,
				PRIMARY KEY (started_sec, team, project, key_name, model, endpoint, status_class)
			) WITHOUT ROWID`,
			fillRollupSQL(dialectSQLite),
			`DROP INDEX usage_records_started`,
			`DROP INDEX usage_records_team_project_started`,
			`DROP INDEX usage_records_model_started`,
			`DROP INDEX usage_records_request_id`,
		},
		postgres: []string{
			`CREATE TABLE usage_rollup (
				started_sec       BIGINT NOT NULL,
				team              TEXT COLLATE "C" NOT NULL,
				project           TEXT COLLATE "C" NOT NULL,
				key_name          TEXT COLLATE "C" NOT NULL,
				model             TEXT COLLATE "C" NOT NULL,
				endpoint          TEXT COLLATE "C" NOT NULL,
				status_class      TEXT COLLATE "C" NOT NULL,
				prompt_tokens     BIGINT NOT NULL,
				completion_tokens BIGINT NOT NULL,
				cached_tokens     BIGINT NOT NULL,
				total_tokens      BIGINT NOT NULL,
				spent_tokens      BIGINT NOT NULL,
				requests          BIGINT NOT NULL,
				records           BIGINT NOT NULL,
				PRIMARY KEY (started_sec, team, project, key_name, model, endpoint, status_class)
			)`,
			fillRollupSQL(dialectPostgres),
			`DROP INDEX usage_records_started`,
			`DROP INDEX usage_records_team_project_started`,
			`DROP INDEX usage_records_model_started`,
			`DROP INDEX usage_records_request_id`,
		},
	},
}
