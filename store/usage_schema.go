package store

// usageMigrations version the usage records schema.
//
// usage_records holds every field of accounting.Record except the payloads
// (Input, Output), which belong to traces. Times are unix nanoseconds, so
// that range scans compare integers. call_id is the key: it is unique per
// completion, while request_id may repeat when a client reuses its
// X-Request-Id, so request_id has a plain index.
//
// Indexes, the same on both engines:
//   - primary key (call_id): the idempotent insert (ON CONFLICT);
//   - usage_records_started (started): SpentTokens (started >= since) and
//     the usage API without a team, project or model filter;
//   - usage_records_team_project_started (team, project, started): the
//     usage API's team restriction and project filter;
//   - usage_records_model_started (model, started): its model filter;
//   - usage_records_request_id (request_id): lookups by X-Request-Id.
//
// On PostgreSQL, text columns use the "C" collation, so that ORDER BY and
// comparisons are bytewise as in SQLite whatever the database's locale;
// stream and incomplete are BOOLEAN.
//
// Version 2 adds endpoint, the OpenAI endpoint of the record
// ("chat.completions", "completions", "embeddings", "responses"); rows
// written before it are chat completions, which its default says. It has
// no index: the usage API filters on it only next to a time range, which
// the indexes above already narrow, and four values select too little to
// be worth one.
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
}
