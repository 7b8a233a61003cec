package store

import (
	"context"
	"time"

	"github.com/tollgate-dev/tollgate/accounting"
)

// UsageBatchPurge is how many expired batch markers a batch deletes.
const UsageBatchPurge = usageBatchPurge

// UsageBatchTTL is how long a batch's marker is kept.
const UsageBatchTTL = usageBatchTTL

// InsertRecordsAt is InsertRecords at now, the time its marker is dated
// and its purge counts from.
func (d *DB) InsertRecordsAt(ctx context.Context, recs []accounting.Record, now time.Time) error {
	return d.insertRecords(ctx, recs, now)
}
