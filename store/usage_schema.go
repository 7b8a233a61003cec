package store

// usageMigrations version the usage schema.
//
// usage_rollup (version 3, see usage_rollup.go) is the usage: the sums of
// the records per second, team, project, key, model, endpoint and status
// class, filled by InsertRecords in the transaction that writes the
// records' gateway calls (gateway_calls.go), which hold every field of a
// record but its payloads, one call per request.
//
// usage_batches (version 4) marks each batch InsertRecords wrote, by its
// first record's call id and its record count, so that a batch the
// recorder writes again after an ambiguous commit is not rolled up twice
// (see InsertRecords). written_at (unix nanoseconds) dates the marker; each
// batch purges a few markers older than a day (usageBatchTTL), so the
// table holds about a day of batches, one row per batch of up to 512
// records.
//
// usage_records (versions 1 and 2) held one row per record, every field of
// accounting.Record but the payloads, keyed by call_id, and was the
// roll-up's idempotency key until version 4. Since version 4 nothing
// writes or reads it: the same facts are in the gateway calls. It is kept,
// with the rows written before, as the users' data it is; times are unix
// nanoseconds.
//
// Indexes, the same on both engines:
//   - usage_rollup, primary key (started_sec, team, project, key_name,
//     model, endpoint, status_class): the upsert of each batch's rows, and
//     the time range SpentTokens and UsageBuckets scan; the time first
//     keeps a batch's upserts at the end of the tree. On SQLite it is
//     WITHOUT ROWID, one tree instead of a table and its key's index.
//   - usage_batches, primary key (first_call_id, records): the idempotent
//     insert of the marker (ON CONFLICT DO NOTHING), whose count of
//     inserted rows tells InsertRecords whether the batch is new; the
//     proxy's call ids are UUIDv7, so inserts append. WITHOUT ROWID on
//     SQLite.
//   - usage_batches_written_at: the purge of the oldest markers.
//   - usage_records, primary key (call_id), left from when it was written.
//
// On PostgreSQL, text columns use the "C" collation, so that ORDER BY and
// comparisons are bytewise as in SQLite whatever the database's locale;
// stream and incomplete are BOOLEAN.
//
// Version 1 indexed usage_records by started, by (team, project,
// started), by (model, started) and by request_id, for reads that now go
// to usage_rollup (request_id had no reader); version 3 drops them: every
// record paid for their inserts, and the roll-up that serves those reads
// costs the writer far less.
//
// Version 2 adds endpoint, the OpenAI endpoint of the record
// ("chat.completions", "completions", "embeddings", "responses"); rows
// written before it are chat completions, which its default says.
//
// Version 3 creates usage_rollup and fills it from the records already
// stored (fillRollupSQL, with the classes and saturating sums InsertRecords
// keeps), and drops the indexes above.
//
// Version 5 creates usage_refused, where SetAside keeps the records
// InsertRecords refused (accounting.ErrRecordRefused: a value the engine
// cannot hold), one row per record: record is the record as JSON (see
// refusedRecord), reason the engine's error, refused_at when (unix
// nanoseconds), record_sha256 the hex SHA-256 of record, the primary key
// that makes setting a record aside again a no-op. Nothing reads or purges
// it: it is for an operator to inspect, account for by hand and delete.
//
// Version 4 creates usage_batches, and InsertRecords stops writing
// usage_records, a row that repeated the gateway call's fields, so that a
// record's fields are written and allocated once rather than twice.
//
// Version 6 adds usage_rollup.cache_write_tokens, the sum of the records'
// CacheWriteTokens (prompt tokens written to a backend's prompt cache,
// part of prompt_tokens as cached_tokens are), so that they can be priced
// apart. Rows summed before it hold 0: the records they sum counted their
// cache writes in prompt_tokens only.
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
	{
		component: "usage",
		version:   4,
		sqlite: []string{
			`CREATE TABLE usage_batches (
				first_call_id TEXT    NOT NULL,
				records       INTEGER NOT NULL,
				written_at    INTEGER NOT NULL,
				PRIMARY KEY (first_call_id, records)
			) WITHOUT ROWID`,
			`CREATE INDEX usage_batches_written_at ON usage_batches (written_at)`,
		},
		postgres: []string{
			`CREATE TABLE usage_batches (
				first_call_id TEXT COLLATE "C" NOT NULL,
				records       BIGINT NOT NULL,
				written_at    BIGINT NOT NULL,
				PRIMARY KEY (first_call_id, records)
			)`,
			`CREATE INDEX usage_batches_written_at ON usage_batches (written_at)`,
		},
	},
	{
		component: "usage",
		version:   5,
		sqlite: []string{
			`CREATE TABLE usage_refused (
				record_sha256 TEXT    NOT NULL PRIMARY KEY,
				refused_at    INTEGER NOT NULL,
				reason        TEXT    NOT NULL,
				record        TEXT    NOT NULL
			)`,
		},
		postgres: []string{
			`CREATE TABLE usage_refused (
				record_sha256 TEXT COLLATE "C" NOT NULL PRIMARY KEY,
				refused_at    BIGINT NOT NULL,
				reason        TEXT NOT NULL,
				record        TEXT NOT NULL
			)`,
		},
	},
	{
		component: "usage",
		version:   6,
		sqlite: []string{
			`ALTER TABLE usage_rollup ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0`,
		},
		postgres: []string{
			`ALTER TABLE usage_rollup ADD COLUMN cache_write_tokens BIGINT NOT NULL DEFAULT 0`,
		},
	},
}
