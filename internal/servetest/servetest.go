// Package servetest runs a server that a test or a benchmark needs until
// the test is done with it.
package servetest

import (
	"context"
	"sync"
	"testing"
)

// Start runs serve on a goroutine of its own, with a context that stop
// cancels. stop then waits for serve to return and reports through tb an
// error it returned. stop runs once however often it is called, and tb's
// cleanup calls it too; cleanups run last registered first, so a server
// started after its upstream stops before it.
func Start(tb testing.TB, serve func(ctx context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				tb.Errorf("serve: %v", err)
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}
