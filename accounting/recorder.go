package accounting

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Store is what the Recorder needs from persistence.
type Store interface {
	// InsertRecords persists recs in one transaction: all or none. It must
	// not keep recs after it returns (the Recorder reuses the slice), and it
	// should be idempotent per CallID, since a batch whose commit was
	// reported failed is written again. An error that wraps
	// ErrRecordRefused says that the store cannot hold one of the records
	// as it is; any other error is taken for a failure to reach or use the
	// store, and the batch is written again.
	InsertRecords(ctx context.Context, recs []Record) error
	// SetAside keeps rec, a record the store refused, for an operator to
	// inspect, with reason, why it was refused. It must take any record
	// whatever its values, and should be idempotent, since a call whose
	// commit was reported failed is made again.
	SetAside(ctx context.Context, rec Record, reason string) error
}

// ErrRecordRefused is wrapped by a Store's error when the store cannot
// hold a record's values (a text too long for an index, not UTF-8, a
// NUL): writing the same record again would fail the same way. The
// Recorder then writes the batch's records one at a time and sets aside
// the ones refused (see Store.SetAside), so that one record never holds
// back the others.
var ErrRecordRefused = errors.New("the store refused a usage record's values")

// RecorderOptions size the Recorder's queue and batches. Zero values take
// the defaults of config.Usage.
type RecorderOptions struct {
	// QueueSize bounds the records waiting to be written. Zero means 65536.
	QueueSize int
	// BatchSize is the most records written in one transaction. Zero means 512.
	BatchSize int
	// FlushInterval is the longest a record waits before its batch is
	// written. Zero means 1s.
	FlushInterval time.Duration
	// Labels bounds the team, project and model labels of the token
	// counters (see SetLabelPolicy). Nil counts every team, project and
	// model as OtherLabel.
	Labels *LabelPolicy

	// ticks, when set, replaces the FlushInterval ticker: tests tick the
	// writer themselves. Nil means a ticker of FlushInterval.
	ticks <-chan time.Time
}

// backoff paces retries of a failed write: the first retry waits min, each
// next one twice as long, up to max.
type backoff struct {
	min, max time.Duration
}

var defaultBackoff = backoff{min: 100 * time.Millisecond, max: 30 * time.Second}

const (
	// closedBit is set in Recorder.state once Close has begun; the bits
	// below it count Record calls between their closed check and the end of
	// their enqueue.
	closedBit = int64(1) << 62

	// backpressureLogEvery spaces the warnings about a full queue: the
	// counter has every wait, the log only says it is happening.
	backpressureLogEvery = 10 * time.Second
)

// MaxRecordTokens is the largest token count a Record may carry in any of
// its counts, and the largest a backend may report (the proxy refuses a
// usage block above it): 2^40, about 1.1 × 10^12, a million times the
// longest context windows of today, yet 2^23 such counts still sum within
// an int64, and sums read from the store saturate (AddTokens). The Recorder
// writes a record with a count outside [0, MaxRecordTokens] as an error
// with zero tokens.
const MaxRecordTokens = 1 << 40

// Recorder persists usage records off the request path. Record puts a
// record on a bounded queue; one writer goroutine takes records off it and
// writes them in batches, retrying failed writes with backoff. Nothing is
// dropped silently: a full queue makes Record wait, and a record that cannot
// be written at all (see Close) is counted and logged at error level.
//
// The writer does not wait on the queue itself: it sleeps until a batch is
// queued or the flush interval ticks. Waking it for every record would
// cost every request a wake-up; this way a request pays one append under a
// mutex, and the writer wakes once per batch. The queue's memory grows with
// what is queued, up to QueueSize records (see recordQueue).
type Recorder struct {
	store    Store
	log      *zap.Logger
	metrics  *recorderMetrics
	queue    *recordQueue
	batch    int
	interval time.Duration
	ticks    <-chan time.Time // nil: a ticker of interval
	backoff  backoff

	// notify wakes the writer when a full batch is queued (or the queue is
	// full); it holds at most one pending wake-up.
	notify chan struct{}
	// notifyAt is the queue length that makes a batch: BatchSize, or the
	// queue size if that is smaller.
	notifyAt int

	// state is closedBit | in-flight Record calls. Close sets closedBit and
	// waits for the count to reach zero before telling the writer to drain,
	// so that no record can enter the queue after the final drain. Every
	// Record writes it twice, so it has a cache line of its own: sharing one
	// with the fields the writer reads would slow both sides.
	_        [64]byte
	state    atomic.Int64
	_        [56]byte
	idle     chan struct{} // closed when closing and no Record is in flight
	idleOnce sync.Once

	drain      chan struct{} // closed by Close: write what is queued, then exit
	abort      chan struct{} // closed when Close gives up: stop waiting and retrying
	ctx        context.Context
	cancel     context.CancelFunc // cancels ctx, the context of store writes
	done       chan struct{}      // closed when the writer goroutine has exited
	writerLost int                // records the writer gave up on; read after done

	// inflight is the batch the writer has taken off the queue and not yet
	// written. It lives here, not on the writer's stack, so that a writer
	// loop restarted after a panic writes it rather than lose it.
	inflight []Record

	// tokens caches the token counters by label values; only the writer
	// goroutine uses it, so that it looks labels up without the CounterVec's
	// hashing and locking.
	tokens map[tokenLabels]tokenCounters
	// labels is the current label policy; a reload replaces it.
	labels atomic.Pointer[LabelPolicy]

	lastWarn atomic.Int64 // unix nanoseconds of the last backpressure warning

	// lowPriority is set when the writer's thread runs at a lowered
	// priority (writer_priority.go); only the writer goroutine uses it.
	lowPriority bool
}

type tokenLabels struct{ team, project, model string }

type tokenCounters struct{ prompt, completion prometheus.Counter }

// NewRecorder starts a Recorder writing to st; Close stops it. Its metrics
// are registered on reg (nil registers nothing).
func NewRecorder(st Store, opts RecorderOptions, log *zap.Logger, reg prometheus.Registerer) *Recorder {
	return newRecorder(st, opts, log, reg, defaultBackoff)
}

func newRecorder(st Store, opts RecorderOptions, log *zap.Logger, reg prometheus.Registerer, bo backoff) *Recorder {
	if opts.QueueSize <= 0 {
		opts.QueueSize = 65536
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 512
	}
	if opts.FlushInterval <= 0 {
		opts.FlushInterval = time.Second
	}
	if log == nil {
		log = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Recorder{
		store:    st,
		log:      log,
		queue:    newRecordQueue(opts.QueueSize, 4*min(opts.BatchSize, opts.QueueSize)),
		batch:    opts.BatchSize,
		interval: opts.FlushInterval,
		ticks:    opts.ticks,
		backoff:  bo,
		notify:   make(chan struct{}, 1),
		notifyAt: min(opts.BatchSize, opts.QueueSize),
		idle:     make(chan struct{}),
		drain:    make(chan struct{}),
		abort:    make(chan struct{}),
		ctx:      ctx,
		cancel:   cancel,
		done:     make(chan struct{}),
		tokens:   make(map[tokenLabels]tokenCounters),
		inflight: make([]Record, 0, opts.BatchSize),
	}
	r.metrics = newRecorderMetrics(reg, func() float64 { return float64(r.queue.len()) })
	r.labels.Store(opts.Labels)
	go r.run()
	return r
}

// SetLabelPolicy makes p bound the labels of the token counters from the
// next record taken off the queue on; a configuration reload calls it, so
// that the teams and projects it names get their own series. The series
// of a team no longer named keep their counts.
func (r *Recorder) SetLabelPolicy(p *LabelPolicy) { r.labels.Store(p) }

// Record queues rec to be written. It does not wait for the write; it waits
// only when the queue is full (backpressure), until the writer makes room.
// After Close has begun, rec is not queued: it is counted as lost and
// logged at error level. Its Hold is settled first, whatever happens to it.
func (r *Recorder) Record(rec Record) {
	if rec.Hold != nil {
		rec = settled(rec)
	}
	if r.state.Add(1)&closedBit != 0 {
		r.leave()
		r.lose(rec, "recorded after the recorder was closed")
		return
	}
	if n, room, ok := r.queue.push(rec); !ok {
		r.waitForRoom(rec, room)
	} else if n >= r.notifyAt {
		r.wakeWriter()
	}
	r.leave()
}

// settled is rec once its Hold has been settled, without it. A record
// handed to an interface's method escapes to the heap: settling it here,
// on a copy, keeps Record's own rec on the stack for the requests that
// hold nothing.
//
//go:noinline
func settled(rec Record) Record {
	rec.Hold.Settle(&rec)
	rec.Hold = nil
	return rec
}

// wakeWriter tells the writer a batch is waiting, unless it has been told.
func (r *Recorder) wakeWriter() {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// waitForRoom is Record's slow path: the queue is full, so the request
// waits for the writer rather than lose its record.
func (r *Recorder) waitForRoom(rec Record, room <-chan struct{}) {
	r.metrics.backpressure.Inc()
	r.warnBackpressure()
	for {
		r.wakeWriter()
		select {
		case <-room:
		case <-r.abort:
			r.lose(rec, "the queue was full when the shutdown deadline passed")
			return
		}
		var ok bool
		if _, room, ok = r.queue.push(rec); ok {
			return
		}
	}
}

// warnBackpressure logs that recording waits, at most once per
// backpressureLogEvery, so that a saturated store does not flood the log.
func (r *Recorder) warnBackpressure() {
	now := time.Now().UnixNano()
	last := r.lastWarn.Load()
	if now-last < int64(backpressureLogEvery) || !r.lastWarn.CompareAndSwap(last, now) {
		return
	}
	r.log.Warn("usage queue full: requests wait for the usage writer",
		zap.Int("queue_size", r.queue.max))
}

// leave ends a Record call; the last one out after Close began lets Close
// go on.
func (r *Recorder) leave() {
	if r.state.Add(-1) == closedBit {
		r.idleOnce.Do(r.signalIdle)
	}
}

func (r *Recorder) signalIdle() { close(r.idle) }

var errClosed = errors.New("close recorder: already closed")

// Close stops accepting records, writes everything queued and waits for the
// writer to exit. If ctx ends first, it gives up: the records not yet
// written are counted as lost, each logged at error level, and the returned
// error says how many. Close may be called once; later calls return an error.
func (r *Recorder) Close(ctx context.Context) error {
	for {
		s := r.state.Load()
		if s&closedBit != 0 {
			return errClosed
		}
		if r.state.CompareAndSwap(s, s|closedBit) {
			if s == 0 {
				r.idleOnce.Do(r.signalIdle)
			}
			break
		}
	}
	// Records being enqueued finish first; the writer keeps taking records
	// off the queue meanwhile, so those waiting for room get it.
	select {
	case <-r.idle:
	case <-ctx.Done():
		return r.giveUp(ctx.Err())
	}
	close(r.drain)
	select {
	case <-r.done:
		r.cancel()
		return nil
	case <-ctx.Done():
		return r.giveUp(ctx.Err())
	}
}

// giveUp ends a Close whose deadline passed: it stops the writer and any
// Record waiting for room, then counts what was never written as lost.
func (r *Recorder) giveUp(cause error) error {
	close(r.abort)
	r.cancel()
	// With abort closed no Record call or write blocks any more, so these
	// waits are short.
	<-r.idle
	<-r.done
	n := r.writerLost
	for _, rec := range r.queue.take(nil, r.queue.len()) {
		r.lose(rec, "still queued when the shutdown deadline passed")
		n++
	}
	return fmt.Errorf("close recorder: %d usage records not written: %w", n, cause)
}

// lose counts and logs a record that will never be written. The log line
// carries everything needed to account for the record by hand.
func (r *Recorder) lose(rec Record, why string) {
	r.metrics.lost.Inc()
	r.log.Error("usage record lost: "+why, accountFields(&rec)...)
}

// accountFields are the log fields that let an operator account by hand
// for a record the store never took.
func accountFields(rec *Record, extra ...zap.Field) []zap.Field {
	return append(extra,
		zap.String("request_id", rec.RequestID),
		zap.String("call_id", rec.CallID),
		zap.String("key", rec.KeyName),
		zap.String("team", rec.Team),
		zap.String("project", rec.Project),
		zap.String("model", rec.Model),
		zap.Int64("prompt_tokens", rec.PromptTokens),
		zap.Int64("completion_tokens", rec.CompletionTokens),
		zap.Int64("total_tokens", rec.TotalTokens),
		zap.Int64("cached_tokens", rec.CachedTokens),
		zap.Int64("cache_write_tokens", rec.CacheWriteTokens),
		zap.Time("started", rec.Started))
}

// run is the writer goroutine. It writes full batches as they are queued,
// and everything queued at each tick of the flush interval, so that a quiet
// gateway still writes within the interval and a busy one writes few, large
// transactions. A panic in the loop (a bug, or a store failing on bytes it
// was handed) does not end the process nor lose the batch in hand: it is
// logged and counted, and the loop starts again with that batch.
func (r *Recorder) run() {
	defer close(r.done)
	// Locked for good: the thread's priority is lowered below, and the
	// thread ends with this goroutine rather than serve another.
	runtime.LockOSThread()
	r.lowPriority = lowerWriterPriority()
	tick := r.ticks
	if tick == nil {
		t := time.NewTicker(r.interval)
		defer t.Stop()
		tick = t.C
	}
	for !r.serve(tick) {
	}
}

// serve is the writer loop. It returns true when the writer is done, and
// false after recovering from a panic, to be called again.
func (r *Recorder) serve(tick <-chan time.Time) (done bool) {
	defer func() {
		if p := recover(); p != nil {
			r.metrics.panics.Inc()
			r.log.Error("usage writer recovered from a panic; the batch in hand is written again",
				zap.Any("panic", p), zap.Int("records", len(r.inflight)), zap.ByteString("stack", debug.Stack()))
			done = false
		}
	}()
	if len(r.inflight) > 0 && !r.write(r.inflight) {
		return true
	}
	r.inflight = r.inflight[:0]
	for {
		var ok bool
		select {
		case <-r.notify:
			ok = r.flush(r.notifyAt, math.MaxInt)
		case <-tick:
			// What is queued at the tick, and no more: records that arrive
			// while it is written wait for a full batch or the next tick.
			// Chasing them wrote a run of small transactions after every
			// tick at a steady load, each costing a commit, back to back
			// on one core.
			ok = r.flush(1, r.queue.len())
			r.queue.trim()
		case <-r.drain:
			// No Record is in flight any more, so the queue only shrinks.
			r.flush(1, math.MaxInt)
			return true
		case <-r.abort:
			return true
		}
		if !ok {
			return true
		}
	}
}

// flush writes batches while at least atLeast records are queued, taking
// at most limit records in all. It returns false when Close gave up during
// a write.
func (r *Recorder) flush(atLeast, limit int) bool {
	for limit > 0 && r.queue.len() >= atLeast {
		start := len(r.inflight)
		r.inflight = r.queue.take(r.inflight, min(r.batch-start, limit))
		limit -= len(r.inflight) - start
		for i := start; i < len(r.inflight); i++ {
			r.count(&r.inflight[i])
		}
		if !r.write(r.inflight) {
			return false
		}
		// The batch's array is reused: drop the records' strings and
		// payloads now rather than keep them until overwritten.
		clear(r.inflight)
		r.inflight = r.inflight[:0]
	}
	return true
}

// count counts the tokens of rec, just taken off the queue. Tokens are
// counted here, once per record, rather than in Record (off the request
// path) or after the write (a retried batch would count twice). A record
// whose counts no backend could have meant is made an error with zero
// tokens first, so that neither the counters (which cannot go down) nor
// the store see them.
func (r *Recorder) count(rec *Record) {
	if bad := invalidCount(rec); bad != "" {
		r.refuseCounts(rec, bad)
	}
	if rec.PromptTokens != 0 || rec.CompletionTokens != 0 {
		p := r.labels.Load()
		k := tokenLabels{p.Team(rec.Team), p.Project(rec.Project), p.Model(rec.Model)}
		c, ok := r.tokens[k]
		if !ok {
			c = tokenCounters{
				prompt:     r.metrics.promptTokens.WithLabelValues(k.team, k.project, k.model),
				completion: r.metrics.completionTokens.WithLabelValues(k.team, k.project, k.model),
			}
			r.tokens[k] = c
		}
		c.prompt.Add(float64(rec.PromptTokens))
		c.completion.Add(float64(rec.CompletionTokens))
	}
}

// invalidCount names the first count of rec outside [0, MaxRecordTokens]
// with its value, e.g. "prompt_tokens=-5", or returns "".
func invalidCount(rec *Record) string {
	for _, c := range [...]struct {
		name string
		n    int64
	}{
		{"prompt_tokens", rec.PromptTokens},
		{"completion_tokens", rec.CompletionTokens},
		{"total_tokens", rec.TotalTokens},
		{"cached_tokens", rec.CachedTokens},
		{"cache_write_tokens", rec.CacheWriteTokens},
	} {
		if c.n < 0 || c.n > MaxRecordTokens {
			return c.name + "=" + strconv.FormatInt(c.n, 10)
		}
	}
	return ""
}

// refuseCounts makes rec an error record with zero tokens, keeping what
// was wrong in its Error, and counts and logs it.
func (r *Recorder) refuseCounts(rec *Record, bad string) {
	r.metrics.invalid.Inc()
	r.log.Warn("usage record with an impossible token count stored as an error with zero tokens",
		zap.String("count", bad),
		zap.String("request_id", rec.RequestID),
		zap.String("call_id", rec.CallID),
		zap.String("backend", rec.Backend),
		zap.String("model", rec.Model))
	msg := "invalid usage reported: " + bad
	if rec.Error != "" {
		msg = rec.Error + "; " + msg
	}
	rec.Error = msg
	rec.ClearTokens()
}

// write persists batch, retrying with backoff until it succeeds. It
// returns false, after counting the batch as lost, only when Close gives
// up. A batch the store cannot take as it is (it panics, or refuses a
// record: ErrRecordRefused) is written one record at a time, so that one
// record it cannot take does not hold back the others (see writeEach and
// writeAlone). Any other failure is retried, the whole batch at once.
func (r *Recorder) write(batch []Record) bool {
	err := r.retry(len(batch), "write usage records failed; retrying", func() error { return r.insert(batch) })
	switch {
	case errors.Is(err, errGaveUp):
		r.loseBatch(batch)
		return false
	case err == nil:
		r.metrics.written.Add(float64(len(batch)))
		r.metrics.observeWriteLag(batch, time.Now())
		return true
	case len(batch) > 1:
		return r.writeEach(batch)
	}
	return r.writeAlone(batch[0], err)
}

// errGaveUp is retry's error when Close gave up before a write succeeded.
var errGaveUp = errors.New("close recorder: gave up waiting for the store")

// retry calls op, which writes records records, until it succeeds or fails
// for good: it returns nil, the error of a store that panicked or refused
// the records (see isRefusal), or errGaveUp when Close gave up first.
// Other failures are logged with msg and retried with backoff.
func (r *Recorder) retry(records int, msg string, op func() error) error {
	wait := r.backoff.min
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for attempt := 1; ; attempt++ {
		err := op()
		if err == nil || isRefusal(err) {
			if ce := r.log.Check(zap.DebugLevel, "usage records written"); err == nil && ce != nil {
				ce.Write(zap.Int("records", records), zap.Int("attempts", attempt))
			}
			return err
		}
		r.metrics.failed.Add(float64(records))
		select {
		case <-r.abort:
			return errGaveUp
		default:
		}
		r.log.Error(msg, zap.Error(err), zap.Int("records", records),
			zap.Int("attempt", attempt), zap.Duration("retry_in", wait))
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-timer.C:
		case <-r.abort:
			return errGaveUp
		}
		r.metrics.retried.Add(float64(records))
		wait = min(2*wait, r.backoff.max)
	}
}

// isRefusal reports whether err is a store's failure that writing the
// same records again cannot heal: a panic, or a refusal of their values.
func isRefusal(err error) bool {
	var pe *storePanic
	return errors.As(err, &pe) || errors.Is(err, ErrRecordRefused)
}

func (r *Recorder) loseBatch(batch []Record) {
	for _, rec := range batch {
		r.lose(rec, "not written when the shutdown deadline passed")
	}
	r.writerLost += len(batch)
}

// storePanic is a panic of the store, turned into an error.
type storePanic struct{ value any }

func (e *storePanic) Error() string { return fmt.Sprintf("store panicked: %v", e.value) }

// insert calls the store, turning a panic into a *storePanic error: the
// store handles bytes that came from clients and backends, and one record
// it chokes on must not end the process.
func (r *Recorder) insert(batch []Record) error {
	if !r.lowPriority || r.queue.len() <= writerBacklogBatches*r.batch {
		return r.insertHere(batch)
	}
	// Backlogged: at its low priority the writer's thread could starve
	// under saturation (see writer_priority.go), so this batch is written
	// at normal priority, from a goroutine of its own.
	r.metrics.normalPriorityBatches.Inc()
	errc := make(chan error, 1)
	go func() { errc <- r.insertHere(batch) }()
	return <-errc
}

// insertHere writes batch on the calling goroutine, recovering a panic of
// the store as a *storePanic.
func (r *Recorder) insertHere(batch []Record) error {
	return r.guard(len(batch), func() error { return r.store.InsertRecords(r.ctx, batch) })
}

// guard calls op, a call of the store about records records, recovering a
// panic as a *storePanic, logged with its stack and counted.
func (r *Recorder) guard(records int, op func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.metrics.panics.Inc()
			r.log.Error("usage store panicked writing records",
				zap.Any("panic", p), zap.Int("records", records), zap.ByteString("stack", debug.Stack()))
			err = &storePanic{value: p}
		}
	}()
	return op()
}

// writeEach writes the records of a batch the store could not take as it
// is one at a time, each with write's retries and, for a record the store
// cannot take either, writeAlone's. It returns false only when Close gave
// up, after counting the records not reached as lost.
func (r *Recorder) writeEach(batch []Record) bool {
	for i := range batch {
		if !r.write(batch[i : i+1]) {
			for _, rec := range batch[i+1:] {
				r.lose(rec, "not written when the shutdown deadline passed")
			}
			r.writerLost += len(batch) - i - 1
			return false
		}
	}
	return true
}

// writeAlone handles rec, a single record the store could not take with
// cause. A record it refused is set aside as it is. A record it panicked
// on is written once more stripped to its accounting (no payloads, zero
// tokens, the panic in its Error), with the usual retries, and set aside
// if the store cannot take even that. It returns false only when Close
// gave up.
func (r *Recorder) writeAlone(rec Record, cause error) bool {
	var pe *storePanic
	if !errors.As(cause, &pe) {
		return r.setAside(rec, cause)
	}
	stripped := rec
	stripped.Input, stripped.Output = nil, nil
	stripped.ClearTokens()
	msg := "usage record could not be stored whole: " + cause.Error()
	if stripped.Error != "" {
		msg = stripped.Error + "; " + msg
	}
	stripped.Error = msg
	one := []Record{stripped}
	err := r.retry(1, "write usage records failed; retrying", func() error { return r.insert(one) })
	switch {
	case errors.Is(err, errGaveUp):
		r.loseBatch(one)
		return false
	case err == nil:
		r.metrics.written.Inc()
		return true
	}
	return r.setAside(rec, err)
}

// setAside hands rec, a record the store could not take because of err,
// to the store's SetAside, with the usual retries, and counts and logs it
// once, with what is needed to account for it by hand. A record the store
// cannot even set aside is lost, loudly. It returns false only when Close
// gave up.
func (r *Recorder) setAside(rec Record, cause error) bool {
	r.metrics.refused.Inc()
	r.log.Error("usage record refused by the store; set aside", accountFields(&rec, zap.NamedError("cause", cause))...)
	reason := cause.Error()
	err := r.retry(1, "set aside a refused usage record failed; retrying", func() error {
		return r.guard(1, func() error { return r.store.SetAside(r.ctx, rec, reason) })
	})
	switch {
	case errors.Is(err, errGaveUp):
		r.loseBatch([]Record{rec})
		return false
	case err != nil:
		r.lose(rec, "the store could not set it aside: "+err.Error())
	}
	return true
}
