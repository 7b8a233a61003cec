package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// responseOwnerMigrations version the response_owners table: which backend
// made each Responses API response, so that every replica sends a
// follow-up (GET, DELETE, cancel, previous_response_id) to the backend
// that holds the response, and (since version 2) the team and project it
// was made for, so that every replica refuses other teams' keys. Rows of
// version 1 have an empty team: not known. expires is unix nanoseconds;
// its index serves the purge.
var responseOwnerMigrations = []migration{
	{
		component: "responses",
		version:   1,
		sqlite: []string{
			`CREATE TABLE response_owners (
				response_id TEXT    NOT NULL PRIMARY KEY,
				backend     TEXT    NOT NULL,
				expires     INTEGER NOT NULL
			)`,
			`CREATE INDEX response_owners_expires ON response_owners (expires)`,
		},
		postgres: []string{
			`CREATE TABLE response_owners (
				response_id TEXT COLLATE "C" NOT NULL PRIMARY KEY,
				backend     TEXT COLLATE "C" NOT NULL,
				expires     BIGINT NOT NULL
			)`,
			`CREATE INDEX response_owners_expires ON response_owners (expires)`,
		},
	},
	{
		component: "responses",
		version:   2,
		sqlite: []string{
			`ALTER TABLE response_owners ADD COLUMN team TEXT NOT NULL DEFAULT ''`,
			`ALTER TABLE response_owners ADD COLUMN project TEXT NOT NULL DEFAULT ''`,
		},
		postgres: []string{
			`ALTER TABLE response_owners ADD COLUMN team TEXT COLLATE "C" NOT NULL DEFAULT ''`,
			`ALTER TABLE response_owners ADD COLUMN project TEXT COLLATE "C" NOT NULL DEFAULT ''`,
		},
	},
}

// responseOwnerPurgeBatch bounds the expired rows one ClaimResponseOwner
// deletes. Every claim adds at most one row and takes up to this many
// expired ones away, so the table stays near its live rows without any
// statement ever deleting an unbounded number.
const responseOwnerPurgeBatch = 100

// expiredResponseOwners are the response owners past their expiry.
var expiredResponseOwners = expiringRows{table: "response_owners", key: "response_id", at: "expires", inclusive: true}

// ClaimResponseOwner records that backend made the response responseID
// for team and project, until expires, unless another owner holds it: the
// first claim wins, on every engine and across the replicas sharing the
// store, and a later claim by anyone else changes nothing (a team that
// makes a backend answer with another team's id must not gain it). A
// claim by the owner of record (same backend, team and project) extends
// its expiry; an expired row is no owner and is replaced. It returns the
// owner of record after the claim: the caller's own when it won. An empty
// team records a response whose team is not known. It also purges up to
// responseOwnerPurgeBatch expired rows.
func (d *DB) ClaimResponseOwner(ctx context.Context, responseID, backend, team, project string, expires time.Time) (ownerBackend, ownerTeam, ownerProject string, err error) {
	if responseID == "" || backend == "" {
		return "", "", "", errors.New("claim response owner: empty response id or backend")
	}
	c := d.conn()
	now := time.Now().UnixNano()
	if _, err := expiredResponseOwners.purge(ctx, c, now, responseOwnerPurgeBatch); err != nil {
		return "", "", "", fmt.Errorf("claim response owner: %w", err)
	}
	// Each attempt is one statement, so that two claims at once cannot both
	// win: the conflict clause only replaces an expired row or renews the
	// owner's own, and returns the row only then. Losing, the claim reads
	// the owner of record, unless that row expired and was purged in
	// between: then the id is free, and the claim tries again.
	for range 3 {
		err = c.queryRow(ctx, `INSERT INTO response_owners (response_id, backend, team, project, expires) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (response_id) DO UPDATE SET backend = excluded.backend, team = excluded.team,
				project = excluded.project, expires = excluded.expires
			WHERE response_owners.expires <= ? OR (response_owners.backend = excluded.backend
				AND response_owners.team = excluded.team AND response_owners.project = excluded.project)
			RETURNING backend, team, project`,
			responseID, backend, team, project, expires.UnixNano(), now).Scan(&ownerBackend, &ownerTeam, &ownerProject)
		if !errors.Is(err, sql.ErrNoRows) {
			break
		}
		err = c.queryRow(ctx, `SELECT backend, team, project FROM response_owners WHERE response_id = ?`,
			responseID).Scan(&ownerBackend, &ownerTeam, &ownerProject)
		if !errors.Is(err, sql.ErrNoRows) {
			break
		}
	}
	if err != nil {
		return "", "", "", fmt.Errorf("claim response owner: %w", err)
	}
	return ownerBackend, ownerTeam, ownerProject, nil
}

// ResponseOwner returns the backend that made responseID and the team and
// project it was made for, if a replica claimed it and it has not expired.
func (d *DB) ResponseOwner(ctx context.Context, responseID string) (backend, team, project string, found bool, err error) {
	err = d.conn().queryRow(ctx, `SELECT backend, team, project FROM response_owners WHERE response_id = ? AND expires > ?`,
		responseID, time.Now().UnixNano()).Scan(&backend, &team, &project)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", "", "", false, nil
	case err != nil:
		return "", "", "", false, fmt.Errorf("response owner: %w", err)
	}
	return backend, team, project, true, nil
}
