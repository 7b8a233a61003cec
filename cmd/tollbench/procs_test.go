package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// A real line, with a command name holding spaces and a parenthesis to
	// show fields are counted from the last ')'. utime is 1234 ticks and
	// stime 56, so 12.90 s at USER_HZ 100.
	line := "4242 (tollgate (x) y) S 1 4242 4242 0 -1 4194560 5000 0 0 0 1234 56 0 0 20 0 9 0 100 800000000 5000 " +
		"18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
	got, err := parseStatCPU([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if want := 12900 * time.Millisecond; got != want {
		t.Errorf("parseStatCPU = %v, want %v", got, want)
	}
}

func TestParseStatCPUErrors(t *testing.T) {
	for _, in := range []string{"", "4242 tollgate S 1", "4242 (tollgate) S 1 2 3", "4242 (t) S 1 1 1 0 -1 0 0 0 0 0 x 56 0"} {
		if _, err := parseStatCPU([]byte(in)); err == nil {
			t.Errorf("parseStatCPU(%q) succeeded, want an error", in)
		}
	}
}

func TestParseStatusMem(t *testing.T) {
	// The memory lines of a real status file, in the kernel's order.
	status := "Name:\ttollgate\nUmask:\t0022\nState:\tS (sleeping)\nVmPeak:\t 1300000 kB\n" +
		"VmHWM:\t   81234 kB\nVmRSS:\t   40000 kB\nRssAnon:\t   30000 kB\nRssFile:\t    9900 kB\n" +
		"RssShmem:\t     100 kB\nVmData:\t  120000 kB\nThreads:\t9\n"
	got, err := parseStatusMem([]byte(status))
	if err != nil {
		t.Fatal(err)
	}
	if want := (memInfo{RSS: 40000 << 10, HWM: 81234 << 10, Anon: 30000 << 10, File: 9900 << 10}); got != want {
		t.Errorf("parseStatusMem = %+v, want %+v", got, want)
	}
}

func TestParseStatusMemErrors(t *testing.T) {
	const (
		rss  = "VmRSS:\t 4 kB\n"
		hwm  = "VmHWM:\t 5 kB\n"
		anon = "RssAnon:\t 3 kB\n"
		file = "RssFile:\t 1 kB\n"
	)
	tests := []struct {
		name, in, wantErr string
	}{
		{"empty", "", "no VmRSS line"},
		{"no VmHWM", rss + anon + file, "no VmHWM line"},
		{"no RssAnon", hwm + rss + file, "no RssAnon line"},
		{"no RssFile (kernel before 4.5)", hwm + rss + anon, "no RssFile line"},
		{"VmRSS not a number", hwm + "VmRSS:\t x kB\n" + anon + file, "VmRSS"},
		{"VmHWM in another unit", "VmHWM:\t 1 MB\n" + rss + anon + file, "unexpected VmHWM line"},
		{"RssAnon not a number", hwm + rss + "RssAnon:\t -3 kB\n" + file, "RssAnon"},
		{"RssFile without a unit", hwm + rss + anon + "RssFile:\t 1\n", "unexpected RssFile line"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseStatusMem([]byte(tt.in))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parseStatusMem(%q) = %v, want an error containing %q", tt.in, err, tt.wantErr)
			}
		})
	}
}

func TestReadOwnProc(t *testing.T) {
	// The parsers must accept what this kernel writes.
	if _, err := readCPU(selfPID()); err != nil {
		t.Fatal(err)
	}
	m, err := readMem(selfPID())
	if err != nil {
		t.Fatal(err)
	}
	// VmRSS is the sum of RssAnon, RssFile and RssShmem, read at once.
	if m.RSS == 0 || m.HWM < m.RSS || m.Anon == 0 || m.File == 0 || m.Anon+m.File > m.RSS {
		t.Errorf("readMem = %+v, want RSS > 0, HWM >= RSS, and Anon and File above 0 adding up to at most RSS", m)
	}
}

func TestParseMachineBusy(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice:
	// busy is 100+2+30+0+5+1 = 138 ticks.
	stat := "cpu  100 2 30 9000 40 0 5 1 0 0\ncpu0 50 1 15 4500 20 0 3 1 0 0\n"
	got, steal, err := parseMachineBusy([]byte(stat))
	if err != nil {
		t.Fatal(err)
	}
	if want, wantSteal := 1380*time.Millisecond, 10*time.Millisecond; got != want || steal != wantSteal {
		t.Errorf("parseMachineBusy = %v, %v; want %v, %v", got, steal, want, wantSteal)
	}
	if _, _, err := parseMachineBusy([]byte("intr 1 2 3\n")); err == nil {
		t.Error("parseMachineBusy accepted a file without a cpu line")
	}
}
