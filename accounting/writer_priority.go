package accounting

// Why the writer lowers its own priority: at a moderate load its batches
// are the only work of the gateway that answers no request, yet each takes
// a core for milliseconds, and requests arriving meanwhile share the other
// core with the client and the backend. That is the tail of the gateway's
// latency in tollbench's open loops (BENCHMARKS.md, "What remains").
// At a lower priority the writer takes the CPU that requests leave idle.
//
// Under saturation there is none: a low-priority writer would starve, the
// queue fill and every request wait on backpressure. An unprivileged
// thread cannot raise its priority again, so the writer does not try:
// while more than writerBacklogBatches batches are queued, it writes each
// batch from a goroutine of its own, on a thread of normal priority, and
// waits for it (Recorder.insert).

// writerNice is the nice value of the writer's thread. 10 gives it about a
// tenth of the weight of a normal thread when the CPU is contended, and all
// of an idle CPU.
const writerNice = 10

// writerBacklogBatches is the queued batches beyond which batches are
// written at normal priority.
const writerBacklogBatches = 4

// lowerWriterPriority lowers the priority of the calling goroutine's OS
// thread, to which the caller has locked it for its life (the thread ends
// with the goroutine, so no other goroutine ever runs at that priority).
// It reports whether the priority was lowered; a system that forbids it
// leaves the writer at normal priority.
func lowerWriterPriority() bool {
	return setThreadNice(currentThread(), writerNice) == nil
}
