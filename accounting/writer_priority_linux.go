package accounting

import "syscall"

// currentThread is the id of the calling goroutine's OS thread; the caller
// must have locked the goroutine to it.
func currentThread() int { return syscall.Gettid() }

// setThreadNice sets the nice value of thread tid. On Linux the priority
// set on a thread id is that thread's alone.
func setThreadNice(tid, nice int) error {
	return syscall.Setpriority(syscall.PRIO_PROCESS, tid, nice)
}
