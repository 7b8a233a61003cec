package accounting

import "sync"

// recordQueue is the Recorder's bounded FIFO of records waiting for the
// writer. Its buffer grows as records arrive, up to max records, instead of
// being allocated at queue_size up front: a channel of the default 65,536
// Records keeps every slot's memory once the writer has cycled through it,
// while a gateway whose writer keeps up never has more than a batch or two
// queued. A buffer a burst grew much larger than a batch is given back once
// it has drained.
//
// Producers (Record) and the single consumer (the writer) share one
// mutex: an append or a batch's copy under it holds the lock for less
// time than the channel operations it replaces.
type recordQueue struct {
	mu sync.Mutex
	// recs[head:] are the queued records, oldest first; recs[:head] were
	// taken and cleared.
	recs []Record
	head int
	// max bounds len(recs)-head.
	max int
	// keep is the capacity a drained buffer may keep; a larger one is
	// dropped so that the memory of a burst is returned.
	keep int
	// room, when not nil, is closed when records are taken off a full
	// queue; producers waiting for room wait on it.
	room chan struct{}
}

func newRecordQueue(max, keep int) *recordQueue {
	return &recordQueue{max: max, keep: keep}
}

// push appends rec unless the queue is full. It returns the queue's length
// after the append and true, or, when full, a channel closed once the
// writer has taken records off the queue, and false.
func (q *recordQueue) push(rec Record) (int, <-chan struct{}, bool) {
	q.mu.Lock()
	n := len(q.recs) - q.head
	if n >= q.max {
		if q.room == nil {
			q.room = make(chan struct{})
		}
		room := q.room
		q.mu.Unlock()
		return n, room, false
	}
	if q.head > 0 && len(q.recs) == cap(q.recs) {
		// Slide the queued records to the front rather than grow a buffer
		// whose first part was already taken.
		k := copy(q.recs, q.recs[q.head:])
		clear(q.recs[k:])
		q.recs, q.head = q.recs[:k], 0
	}
	if q.recs == nil {
		// Start at the size a writer that keeps up lets queue, rather than
		// double through the small sizes on every burst.
		q.recs = make([]Record, 0, min(q.keep, q.max))
	}
	q.recs = append(q.recs, rec)
	q.mu.Unlock()
	return n + 1, nil, true
}

// take moves up to limit of the oldest records onto dst and returns it.
func (q *recordQueue) take(dst []Record, limit int) []Record {
	q.mu.Lock()
	k := min(len(q.recs)-q.head, limit)
	taken := q.recs[q.head : q.head+k]
	dst = append(dst, taken...)
	// The strings and payloads of taken records must not stay reachable
	// from the buffer until overwritten.
	clear(taken)
	q.head += k
	if q.head == len(q.recs) {
		q.recs, q.head = q.recs[:0], 0
	}
	if k > 0 && q.room != nil {
		close(q.room)
		q.room = nil
	}
	q.mu.Unlock()
	return dst
}

// trim gives back a buffer grown past keep by a burst, once the burst has
// been written: the writer calls it at its flush ticks, so that a gateway
// under sustained load keeps its buffer and one after load returns it.
func (q *recordQueue) trim() {
	q.mu.Lock()
	if len(q.recs) == q.head && cap(q.recs) > q.keep {
		q.recs, q.head = nil, 0
	}
	q.mu.Unlock()
}

// len is the number of records queued.
func (q *recordQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.recs) - q.head
}
