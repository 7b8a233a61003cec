//go:build race

package proxy_test

// raceEnabled says the tests run under the race detector, whose
// instrumentation deepens stacks.
const raceEnabled = true
