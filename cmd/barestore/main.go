// Command barestore is the floor of a gateway that accounts for every
// request durably: the bare forwarder of cmd/bareproxy (package bare) that
// also queues a record of each request to the gateway's usage writer
// (accounting.Recorder), which stores it through the gateway's store in an
// SQLite file: one trace call with its keys, its completion link and its
// tokens in the usage roll-up, as the gateway stores a chat completion.
// tollbench -bare-store measures the gateway against it.
//
// The record is made without reading the request or the reply (no
// validation, no usage parsing): its team, project, key, model and token
// counts are fixed, its call id a fresh UUIDv7 (as the gateway's) and its
// completion id a fresh random one dated now, so that the row, its keys and
// its link are of the gateway's shape. A stream is recorded when its
// headers come, not when it ends.
//
//	barestore -upstream 127.0.0.1:9000 -store FILE [-listen 127.0.0.1:0]
//
// It prints "barestore: serving on http://ADDR" once it listens, and stops
// on SIGINT or SIGTERM, writing what is queued before it exits.
package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"time"

	"github.com/google/uuid"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/bare"
	"github.com/tollgate-dev/tollgate/store"
)

func main() { bare.Main("barestore", run) }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("barestore", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := bare.AddFlags(fs)
	path := fs.String("store", "", "the SQLite `file` every request is recorded in")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *f.Upstream == "" || *path == "" {
		return errors.New("-upstream and -store are required")
	}
	return serve(ctx, *f.Upstream, *path, func(p *bare.Proxy) error { return p.Run(ctx, "barestore", *f.Listen, stdout) })
}

// serve opens the store at path, has run serve a bare proxy to upstream
// that records every reply there, and once run returns writes what is
// queued and closes the store.
func serve(ctx context.Context, upstream, path string, run func(*bare.Proxy) error) (err error) {
	st, err := store.Open(ctx, config.Store{Driver: "sqlite", Path: path})
	if err != nil {
		return err
	}
	rec := accounting.NewRecorder(st, accounting.RecorderOptions{}, nil, nil)
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = errors.Join(err, rec.Close(cctx), st.Close())
	}()
	return run(bare.New(upstream, func(started time.Time, status int) { record(rec, started, status) }))
}

// record queues the record of a request the upstream answered with
// status: the fields the gateway fills for a chat completion.
func record(rec *accounting.Recorder, started time.Time, status int) {
	callID, err := uuid.NewV7()
	if err != nil {
		return // crypto/rand failed: the floor then stores less, never more
	}
	id := callID.String()
	now := time.Now()
	rec.Record(accounting.Record{
		RequestID: id, CallID: id, TraceID: id,
		KeyName: "bench", Team: "bench", Project: "floor",
		Model: "bench-model", ServedModel: "bench-model", Backend: "upstream",
		CompletionID: "chatcmpl-" + uuid.NewString(), CompletionCreated: now.Unix(),
		Endpoint: "chat.completions", Status: status,
		PromptTokens: 12, CompletionTokens: 16, TotalTokens: 28,
		Started: started, Ended: now,
	})
}
