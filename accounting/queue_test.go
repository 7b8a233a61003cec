package accounting

import (
	"strconv"
	"testing"
)

func queuedIDs(recs []Record) []string {
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = r.CallID
	}
	return ids
}

func TestRecordQueueOrderAndBound(t *testing.T) {
	q := newRecordQueue(5, 4)
	for i := range 5 {
		n, room, ok := q.push(Record{CallID: strconv.Itoa(i)})
		if !ok || room != nil || n != i+1 {
			t.Fatalf("push %d: n=%d ok=%v room=%v, want n=%d ok", i, n, ok, room, i+1)
		}
	}
	n, room, ok := q.push(Record{CallID: "5"})
	if ok || room == nil || n != 5 {
		t.Fatalf("push to a full queue: n=%d ok=%v room=%v, want refused with a room channel", n, ok, room)
	}
	select {
	case <-room:
		t.Fatal("room signalled before anything was taken")
	default:
	}

	got := q.take(nil, 2)
	if want := []string{"0", "1"}; !equalStrings(queuedIDs(got), want) {
		t.Fatalf("take 2 = %v, want %v", queuedIDs(got), want)
	}
	select {
	case <-room:
	default:
		t.Fatal("taking records off a full queue did not signal room")
	}
	// The taken slots are cleared, so their strings are not kept alive.
	if q.recs[0].CallID != "" || q.recs[1].CallID != "" {
		t.Errorf("taken slots still hold %q, %q", q.recs[0].CallID, q.recs[1].CallID)
	}
	// Pushing into a buffer whose front was taken slides the queued
	// records instead of growing past what max needs.
	for _, id := range []string{"5", "6"} {
		if _, _, ok := q.push(Record{CallID: id}); !ok {
			t.Fatalf("push %s after a take refused", id)
		}
	}
	if q.len() != 5 {
		t.Fatalf("len = %d, want 5", q.len())
	}
	got = q.take(nil, 10)
	if want := []string{"2", "3", "4", "5", "6"}; !equalStrings(queuedIDs(got), want) {
		t.Fatalf("take all = %v, want %v", queuedIDs(got), want)
	}
	if q.len() != 0 {
		t.Fatalf("len after draining = %d, want 0", q.len())
	}
	if got := q.take(nil, 3); len(got) != 0 {
		t.Fatalf("take from an empty queue = %v", queuedIDs(got))
	}
}

func TestRecordQueueGrowsOnDemandAndGivesBack(t *testing.T) {
	const max, keep = 65536, 64
	q := newRecordQueue(max, keep)
	if cap(q.recs) != 0 {
		t.Fatalf("a new queue holds a buffer of %d records, want none", cap(q.recs))
	}
	for i := range 10 {
		q.push(Record{CallID: strconv.Itoa(i)})
	}
	if c := cap(q.recs); c < 10 || c > 64 {
		t.Errorf("10 queued records hold a buffer of %d", c)
	}
	// Small drains keep the buffer for the next records.
	q.take(nil, 10)
	q.trim()
	if cap(q.recs) == 0 {
		t.Error("a drained buffer within keep was dropped")
	}
	// A burst far over keep grows the buffer, and it is given back once drained.
	for i := range 1000 {
		q.push(Record{CallID: strconv.Itoa(i)})
	}
	if got := q.take(nil, 600); len(got) != 600 || got[599].CallID != "599" {
		t.Fatalf("take 600 of the burst: %d records, last %q", len(got), got[len(got)-1].CallID)
	}
	if cap(q.recs) < 1000 {
		t.Fatalf("burst buffer holds %d, want ≥ 1000 while records are queued", cap(q.recs))
	}
	q.take(nil, 1000)
	if cap(q.recs) < 1000 {
		t.Errorf("the burst buffer was dropped before the writer's tick (cap %d)", cap(q.recs))
	}
	q.trim()
	if cap(q.recs) != 0 {
		t.Errorf("a drained burst buffer of %d records was kept, want it given back", cap(q.recs))
	}
}

// The request path's enqueue allocates nothing once the buffer has grown
// to what the writer lets queue up.
func TestRecordQueueSteadyStateAllocatesNothing(t *testing.T) {
	q := newRecordQueue(1024, 512)
	rec := Record{CallID: "0190f2a4-7b1c-7c3e-9d2a-3f4b5c6d7e8f", Team: "acme", PromptTokens: 12}
	batch := make([]Record, 0, 256)
	cycle := func() {
		for range 200 {
			if _, _, ok := q.push(rec); !ok {
				t.Fatal("push refused")
			}
		}
		batch = q.take(batch[:0], 256)
	}
	cycle()
	if n := testing.AllocsPerRun(20, cycle); n != 0 {
		t.Errorf("a push/take cycle allocates %.1f times, want 0", n)
	}
}
