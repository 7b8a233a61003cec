//go:build !linux

package accounting

import "errors"

// currentThread is 0: only Linux sets the priority of one thread.
func currentThread() int { return 0 }

// setThreadNice fails: elsewhere a priority applies to the whole process.
func setThreadNice(int, int) error {
	return errors.New("per-thread priority is only set on Linux")
}
