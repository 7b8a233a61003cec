package store

// weaveMigrations version the schema of the Weave objects, tables, files,
// feedback and prices (package weave), beside the traces component whose
// projects they belong to.
//
// Values (an object's val, a row, a feedback payload) are TEXT holding
// compact JSON, as the calls' documents are; file contents are BLOB on
// SQLite and BYTEA on PostgreSQL. Every table is keyed by project first,
// since every request is scoped to one project:
//   - weave_objects (project_id, object_id, version_index), unique on
//     (project_id, object_id, digest): version reads, the next index,
//     putting the same value again; weave_objects_kind (project_id, kind,
//     object_id) serves listings of ops or of other objects.
//   - weave_tables and weave_table_rows by (project_id, digest): a table
//     keeps its row digests in order as a JSON array, rows are shared by
//     every table of the project that holds them. Since version 2 a large
//     table's list is a tree of chunks in weave_table_chunks by
//     (project_id, digest), shared the same way (see PutTable).
//   - weave_files by (project_id, digest).
//   - weave_feedback by (project_id, id), and (project_id, weave_ref) for
//     the feedback of one call or object.
//   - weave_costs by (project_id, id), and (project_id, llm_id,
//     effective_date) for the price in effect.
var weaveMigrations = []migration{
	{
		component: "weave",
		version:   1,
		sqlite: []string{
			`CREATE TABLE weave_objects (
				project_id        INTEGER NOT NULL REFERENCES projects (id),
				object_id         TEXT NOT NULL,
				version_index     INTEGER NOT NULL,
				digest            TEXT NOT NULL,
				kind              TEXT NOT NULL,
				base_object_class TEXT,
				leaf_object_class TEXT,
				val               TEXT NOT NULL,
				size_bytes        INTEGER NOT NULL,
				created_at        TEXT NOT NULL,
				deleted_at        TEXT,
				wb_user_id        TEXT,
				PRIMARY KEY (project_id, object_id, version_index),
				UNIQUE (project_id, object_id, digest))`,
			`CREATE INDEX weave_objects_kind ON weave_objects (project_id, kind, object_id)`,
			`CREATE TABLE weave_tables (
				project_id  INTEGER NOT NULL REFERENCES projects (id),
				digest      TEXT NOT NULL,
				row_digests TEXT NOT NULL,
				row_count   INTEGER NOT NULL,
				PRIMARY KEY (project_id, digest))`,
			`CREATE TABLE weave_table_rows (
				project_id INTEGER NOT NULL REFERENCES projects (id),
				digest     TEXT NOT NULL,
				val        TEXT NOT NULL,
				PRIMARY KEY (project_id, digest))`,
			`CREATE TABLE weave_files (
				project_id INTEGER NOT NULL REFERENCES projects (id),
				digest     TEXT NOT NULL,
				content    BLOB NOT NULL,
				size_bytes INTEGER NOT NULL,
				created_at TEXT NOT NULL,
				PRIMARY KEY (project_id, digest))`,
			`CREATE TABLE weave_feedback (
				project_id     INTEGER NOT NULL REFERENCES projects (id),
				id             TEXT NOT NULL,
				weave_ref      TEXT NOT NULL,
				wb_user_id     TEXT NOT NULL,
				creator        TEXT,
				created_at     TEXT NOT NULL,
				feedback_type  TEXT NOT NULL,
				payload        TEXT NOT NULL,
				annotation_ref TEXT,
				runnable_ref   TEXT,
				call_ref       TEXT,
				trigger_ref    TEXT,
				PRIMARY KEY (project_id, id))`,
			`CREATE INDEX weave_feedback_ref ON weave_feedback (project_id, weave_ref)`,
			`CREATE TABLE weave_costs (
				project_id                 INTEGER NOT NULL REFERENCES projects (id),
				id                         TEXT NOT NULL,
				llm_id                     TEXT NOT NULL,
				prompt_token_cost          REAL NOT NULL,
				completion_token_cost      REAL NOT NULL,
				prompt_token_cost_unit     TEXT NOT NULL,
				completion_token_cost_unit TEXT NOT NULL,
				effective_date             TEXT NOT NULL,
				provider_id                TEXT NOT NULL,
				created_at                 TEXT NOT NULL,
				created_by                 TEXT NOT NULL,
				PRIMARY KEY (project_id, id))`,
			`CREATE INDEX weave_costs_llm ON weave_costs (project_id, llm_id, effective_date)`,
		},
		postgres: []string{
			`CREATE TABLE weave_objects (
				project_id        BIGINT NOT NULL REFERENCES projects (id),
				object_id         TEXT COLLATE "C" NOT NULL,
				version_index     INTEGER NOT NULL,
				digest            TEXT COLLATE "C" NOT NULL,
				kind              TEXT COLLATE "C" NOT NULL,
				base_object_class TEXT COLLATE "C",
				leaf_object_class TEXT COLLATE "C",
				val               TEXT NOT NULL,
				size_bytes        BIGINT NOT NULL,
				created_at        TEXT COLLATE "C" NOT NULL,
				deleted_at        TEXT COLLATE "C",
				wb_user_id        TEXT COLLATE "C",
				PRIMARY KEY (project_id, object_id, version_index),
				UNIQUE (project_id, object_id, digest))`,
			`CREATE INDEX weave_objects_kind ON weave_objects (project_id, kind, object_id)`,
			`CREATE TABLE weave_tables (
				project_id  BIGINT NOT NULL REFERENCES projects (id),
				digest      TEXT COLLATE "C" NOT NULL,
				row_digests TEXT NOT NULL,
				row_count   INTEGER NOT NULL,
				PRIMARY KEY (project_id, digest))`,
			`CREATE TABLE weave_table_rows (
				project_id BIGINT NOT NULL REFERENCES projects (id),
				digest     TEXT COLLATE "C" NOT NULL,
				val        TEXT NOT NULL,
				PRIMARY KEY (project_id, digest))`,
			`CREATE TABLE weave_files (
				project_id BIGINT NOT NULL REFERENCES projects (id),
				digest     TEXT COLLATE "C" NOT NULL,
				content    BYTEA NOT NULL,
				size_bytes BIGINT NOT NULL,
				created_at TEXT COLLATE "C" NOT NULL,
				PRIMARY KEY (project_id, digest))`,
			`CREATE TABLE weave_feedback (
				project_id     BIGINT NOT NULL REFERENCES projects (id),
				id             TEXT COLLATE "C" NOT NULL,
				weave_ref      TEXT COLLATE "C" NOT NULL,
				wb_user_id     TEXT COLLATE "C" NOT NULL,
				creator        TEXT COLLATE "C",
				created_at     TEXT COLLATE "C" NOT NULL,
				feedback_type  TEXT COLLATE "C" NOT NULL,
				payload        TEXT NOT NULL,
				annotation_ref TEXT COLLATE "C",
				runnable_ref   TEXT COLLATE "C",
				call_ref       TEXT COLLATE "C",
				trigger_ref    TEXT COLLATE "C",
				PRIMARY KEY (project_id, id))`,
			`CREATE INDEX weave_feedback_ref ON weave_feedback (project_id, weave_ref)`,
			`CREATE TABLE weave_costs (
				project_id                 BIGINT NOT NULL REFERENCES projects (id),
				id                         TEXT COLLATE "C" NOT NULL,
				llm_id                     TEXT COLLATE "C" NOT NULL,
				prompt_token_cost          DOUBLE PRECISION NOT NULL,
				completion_token_cost      DOUBLE PRECISION NOT NULL,
				prompt_token_cost_unit     TEXT COLLATE "C" NOT NULL,
				completion_token_cost_unit TEXT COLLATE "C" NOT NULL,
				effective_date             TEXT COLLATE "C" NOT NULL,
				provider_id                TEXT COLLATE "C" NOT NULL,
				created_at                 TEXT COLLATE "C" NOT NULL,
				created_by                 TEXT COLLATE "C" NOT NULL,
				PRIMARY KEY (project_id, id))`,
			`CREATE INDEX weave_costs_llm ON weave_costs (project_id, llm_id, effective_date)`,
		},
	},
	{
		// Tables as trees of chunks: a table stored before keeps its row
		// digests in row_digests, as a table of height 0 does.
		component: "weave",
		version:   2,
		sqlite: []string{
			`ALTER TABLE weave_tables ADD COLUMN chunk_height INTEGER NOT NULL DEFAULT 0`,
			`CREATE TABLE weave_table_chunks (
				project_id INTEGER NOT NULL REFERENCES projects (id),
				digest     TEXT NOT NULL,
				items      TEXT NOT NULL,
				PRIMARY KEY (project_id, digest))`,
		},
		postgres: []string{
			`ALTER TABLE weave_tables ADD COLUMN chunk_height INTEGER NOT NULL DEFAULT 0`,
			`CREATE TABLE weave_table_chunks (
				project_id BIGINT NOT NULL REFERENCES projects (id),
				digest     TEXT COLLATE "C" NOT NULL,
				items      TEXT NOT NULL,
				PRIMARY KEY (project_id, digest))`,
		},
	},
}
