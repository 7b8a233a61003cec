package proxy

import (
	"context"
	"time"
)

// ResponseOwnerStore remembers which backend made a response, for replicas.
type ResponseOwnerStore interface {
	PutResponseOwner(ctx context.Context, responseID, backend string, expires time.Time) error
	ResponseOwner(ctx context.Context, responseID string) (backend string, found bool, err error)
}
