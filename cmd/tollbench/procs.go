package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// Import paths of the binaries the benchmark runs as child processes.
const (
	gatewayPkg = "github.com/tollgate-dev/tollgate/cmd/tollgate"
	mockPkg    = "github.com/tollgate-dev/tollgate/cmd/mockllm"
	barePkg    = "github.com/tollgate-dev/tollgate/cmd/bareproxy"
	// bareStorePkg is the bare proxy that also stores every request
	// (-bare-store).
	bareStorePkg = "github.com/tollgate-dev/tollgate/cmd/barestore"
)

// binaries are the programs of a run.
type binaries struct {
	gateway, mock, bare, bareStore string
}

// binariesIn names the binaries as `go build -o dir/` writes them.
func binariesIn(dir string) binaries {
	return binaries{
		gateway:   filepath.Join(dir, "tollgate"),
		mock:      filepath.Join(dir, "mockllm"),
		bare:      filepath.Join(dir, "bareproxy"),
		bareStore: filepath.Join(dir, "barestore"),
	}
}

// userHZ is the unit of utime and stime in /proc/<pid>/stat. The kernel
// reports them in USER_HZ, which is 100 on every Linux architecture Go
// supports; sysconf(_SC_CLK_TCK) would say so too but needs cgo.
const userHZ = 100

// stopGrace is how long a child gets to exit after SIGTERM before it is
// killed. The generated gateway config bounds its graceful shutdown to
// less than this.
const stopGrace = 20 * time.Second

// buildBinaries compiles the gateway, the mock backend and the two bare
// proxies (cmd/bareproxy, and cmd/barestore for -bare-store) into dir, so
// that they run as a user would run them: separate processes from a plain
// `go build`. GOFLAGS from the environment apply, as for any
// go command.
func buildBinaries(ctx context.Context, dir string) (binaries, error) {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator), gatewayPkg, mockPkg, barePkg, bareStorePkg)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return binaries{}, fmt.Errorf("go build: %w\n%s", err, bytes.TrimSpace(out))
	}
	return binariesIn(dir), nil
}

// makeRunDir makes a run's directory, named after pattern as os.MkdirTemp
// names it. remove removes it, unless keep, when the directory is kept and
// its path printed to stderr now instead.
func makeRunDir(pattern string, keep bool, stderr io.Writer) (dir string, remove func() error, err error) {
	dir, err = os.MkdirTemp("", pattern)
	if err != nil {
		return "", nil, fmt.Errorf("make run directory: %w", err)
	}
	if keep {
		fmt.Fprintln(stderr, "tollbench: run directory", dir)
		return dir, func() error { return nil }, nil
	}
	return dir, func() error { return os.RemoveAll(dir) }, nil
}

// proc is one child process, with its combined output going to a log file
// in the run's directory.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	// done is closed once the process has exited and waitErr is set.
	done    chan struct{}
	waitErr error
}

// startProc starts bin. The child gets its own process group, so that a
// Ctrl-C in the terminal reaches only tollbench, which then stops the
// children in order (gateway before backends); and it is sent SIGTERM if
// tollbench dies without stopping it, so that no child outlives a run.
func startProc(name, bin string, args []string, logPath string) (*proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("%s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	// The waiter ends when the process exits, which stop guarantees.
	go func() {
		p.waitErr = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has already ended, and how.
func (p *proc) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.waitErr
	default:
		return false, nil
	}
}

// stop sends SIGTERM, waits up to grace for the process to exit, and kills
// it if it has not. It returns an error when the process exited with a
// failure or had to be killed; calling it again is harmless.
func (p *proc) stop(grace time.Duration) error {
	if ok, err := p.exited(); ok {
		return p.exitError(err)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return p.exitError(p.waitErr)
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not exit within %s of SIGTERM and was killed\n%s", p.name, grace, p.logTail(20))
	}
}

func (p *proc) exitError(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s exited: %w\n%s", p.name, err, p.logTail(20))
}

// logTail returns the last n lines of the process's log, for errors.
func (p *proc) logTail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + p.name + " log (" + p.logPath + "):\n    " + strings.Join(lines, "\n    ")
}

// mockFlags are the mockllm settings of one backend process.
type mockFlags struct {
	itl    time.Duration
	tokens int
}

// startMock starts a mockllm on a free loopback port and returns it with
// the address it printed.
func startMock(ctx context.Context, bin, dir, name string, f mockFlags) (*proc, string, error) {
	args := []string{"-listen", "127.0.0.1:0", "-itl", f.itl.String(), "-tokens", strconv.Itoa(f.tokens)}
	p, err := startProc(name, bin, args, filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, "", err
	}
	addr, err := waitAddr(ctx, p)
	if err != nil {
		return nil, "", errors.Join(err, p.stop(stopGrace))
	}
	return p, addr, nil
}

// bareOptions say which bare proxy to start; the zero value is the plain
// forwarder.
type bareOptions struct {
	// store starts the one that records every request
	// (cmd/barestore), in dir/name.db.
	store bool
	// handOver has it write each stream from a goroutine of the
	// stream's own, as the gateway does (bareproxy -handover).
	handOver bool
}

// startBare starts a bare proxy in front of upstream on a free loopback
// port and returns it with its address.
func startBare(ctx context.Context, bins binaries, dir, name, upstream string, o bareOptions) (*proc, string, error) {
	bin, args := bins.bare, []string{"-listen", "127.0.0.1:0", "-upstream", upstream}
	if o.store {
		bin, args = bins.bareStore, append(args, "-store", filepath.Join(dir, name+".db"))
	}
	if o.handOver {
		args = append(args, "-handover")
	}
	p, err := startProc(name, bin, args, filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, "", err
	}
	addr, err := waitAddr(ctx, p)
	if err != nil {
		return nil, "", errors.Join(err, p.stop(stopGrace))
	}
	return p, addr, nil
}

// waitAddr polls a mock's or bare proxy's log for the line announcing its
// address ("mockllm: serving on http://ADDR ..."), which both print
// unbuffered.
func waitAddr(ctx context.Context, p *proc) (string, error) {
	const marker = "serving on http://"
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(p.logPath); err == nil {
			if i := bytes.Index(b, []byte(marker)); i >= 0 {
				rest := b[i+len(marker):]
				if j := bytes.IndexAny(rest, " \n"); j > 0 {
					return string(rest[:j]), nil
				}
			}
		}
		if ok, err := p.exited(); ok {
			return "", fmt.Errorf("%s exited before serving: %v\n%s", p.name, err, p.logTail(20))
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return "", err
		}
	}
	return "", fmt.Errorf("%s printed no address within 15s\n%s", p.name, p.logTail(20))
}

// freePort returns a loopback address that was free a moment ago. The
// gateway is given a fixed port rather than port 0 because it announces its
// address only in a log line that is flushed once a second; the short race
// with another process taking the port shows up as a failed start.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	return addr, nil
}

// startGateway starts the gateway on configPath at a free port and waits
// until it answers /readyz with 200.
func startGateway(ctx context.Context, bin, configPath, logPath string) (*proc, string, error) {
	addr, err := freePort()
	if err != nil {
		return nil, "", err
	}
	p, err := startProc("gateway", bin, []string{"-config", configPath, "-listen", addr}, logPath)
	if err != nil {
		return nil, "", err
	}
	if err := waitReady(ctx, p, addr); err != nil {
		return nil, "", errors.Join(err, p.stop(stopGrace))
	}
	return p, addr, nil
}

// waitReady polls GET /readyz until it answers 200 (every backend passed
// its health check), the process exits, or 20 s pass.
func waitReady(ctx context.Context, p *proc, addr string) error {
	c := &fasthttp.HostClient{Addr: addr}
	defer c.CloseIdleConnections()
	url := "http://" + addr + "/readyz"
	deadline := time.Now().Add(20 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		status, _, err := c.GetTimeout(nil, url, time.Second)
		if err == nil && status == fasthttp.StatusOK {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = "status " + strconv.Itoa(status)
		}
		if ok, err := p.exited(); ok {
			return fmt.Errorf("%s exited before it was ready: %v\n%s", p.name, err, p.logTail(20))
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("%s not ready within 20s (last: %s)\n%s", p.name, last, p.logTail(20))
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// readCPU returns the user plus system CPU time process pid has used, from
// /proc/<pid>/stat.
func readCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("read cpu time: %w", err)
	}
	return parseStatCPU(b)
}

// parseStatCPU extracts utime+stime from the contents of /proc/<pid>/stat.
// The second field, the command name in parentheses, may itself hold
// spaces and parentheses, so fields are counted from the last ')'.
func parseStatCPU(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("parse /proc stat: no command name")
	}
	// After the name: state is field 3 of the line, utime 14, stime 15.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("parse /proc stat: %d fields after the name, want at least 13", len(f))
	}
	utime, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse /proc stat utime: %w", err)
	}
	stime, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse /proc stat stime: %w", err)
	}
	return time.Duration(utime+stime) * (time.Second / userHZ), nil
}

// readMachineBusy returns the CPU time all CPUs of the machine have spent
// busy, and the part of it the hypervisor gave to other guests (steal),
// from the first line of /proc/stat.
func readMachineBusy() (busy, steal time.Duration, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, fmt.Errorf("read machine cpu time: %w", err)
	}
	return parseMachineBusy(b)
}

// parseMachineBusy sums user, nice, system, irq, softirq and steal of the
// "cpu" line of /proc/stat: everything but idle and iowait. Guest time is
// already counted in user. It also returns steal on its own: on a virtual
// machine whose host is oversubscribed, the time the hypervisor ran other
// guests instead of this one, which slows every process here without
// showing in any of their CPU times.
func parseMachineBusy(b []byte) (busy, steal time.Duration, err error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("parse /proc/stat: unexpected first line %q", line)
	}
	var ticks, stealTicks uint64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("parse /proc/stat: %w", err)
		}
		ticks += v
		if i == 8 {
			stealTicks = v
		}
	}
	tick := time.Second / userHZ
	return time.Duration(ticks) * tick, time.Duration(stealTicks) * tick, nil
}

// memInfo is a process's resident memory, in bytes.
type memInfo struct {
	RSS uint64 // VmRSS: resident now
	HWM uint64 // VmHWM: the peak resident size
	// RSS is anonymous pages (heap, stacks, the Go runtime's arenas: what
	// the program allocated), file-backed pages (the executable and any
	// shared libraries: what it was built as) and shared memory, which
	// none of the measured programs uses.
	Anon uint64 // RssAnon
	File uint64 // RssFile
}

// readMem returns the resident memory of process pid: now, at its peak,
// and the anonymous and file-backed parts of it now.
func readMem(pid int) (memInfo, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return memInfo{}, fmt.Errorf("read memory: %w", err)
	}
	return parseStatusMem(b)
}

// parseStatusMem extracts VmRSS, VmHWM, RssAnon and RssFile from
// /proc/<pid>/status, whose lines read "VmRSS:\t   12345 kB". Each must be
// there (RssAnon and RssFile since Linux 4.5), in kB.
func parseStatusMem(b []byte) (memInfo, error) {
	var m memInfo
	fields := [...]struct {
		key string
		dst *uint64
	}{{"VmRSS", &m.RSS}, {"VmHWM", &m.HWM}, {"RssAnon", &m.Anon}, {"RssFile", &m.File}}
	var seen [len(fields)]bool
	for line := range strings.SplitSeq(string(b), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		for i, f := range fields {
			if f.key != key {
				continue
			}
			v := strings.Fields(val)
			if len(v) != 2 || v[1] != "kB" {
				return memInfo{}, fmt.Errorf("parse /proc status: unexpected %s line %q", key, line)
			}
			kb, err := strconv.ParseUint(v[0], 10, 64)
			if err != nil {
				return memInfo{}, fmt.Errorf("parse /proc status %s: %w", key, err)
			}
			*f.dst, seen[i] = kb<<10, true
		}
	}
	for i, f := range fields {
		if !seen[i] {
			return memInfo{}, fmt.Errorf("parse /proc status: no %s line", f.key)
		}
	}
	return m, nil
}

// raiseNoFile raises this process's open-file limit so that it, and the
// children that inherit it, can hold want descriptors. It sets the soft
// limit to the hard limit; when the hard limit is below want it tries to
// raise the hard limit too, which works only with CAP_SYS_RESOURCE (root).
// It returns the limit in force and, when that is below want, why.
//
// Setting the limit explicitly matters for the children: the Go runtime
// raises its own soft limit at start-up but gives children the original
// one back, unless the program called Setrlimit itself.
func raiseNoFile(want uint64) (uint64, string, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, "", fmt.Errorf("get open-file limit: %w", err)
	}
	if lim.Max < want {
		raised := syscall.Rlimit{Cur: want, Max: want}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err == nil {
			return want, fmt.Sprintf("raised the open-file hard limit from %d to %d (running privileged)", lim.Max, want), nil
		}
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, "", fmt.Errorf("set open-file limit: %w", err)
	}
	if lim.Max < want {
		return lim.Max, fmt.Sprintf("open-file hard limit %d is below the %d the largest open-streams phase needs "+
			"(the bare proxy and then the gateway hold two sockets per stream); expect errors there, or raise `ulimit -Hn`", lim.Max, want), nil
	}
	return lim.Max, "", nil
}

// describeMachine gathers what the report says about the machine.
func describeMachine(nofile uint64) machine {
	m := machine{Cores: runtime.NumCPU(), NoFileLimit: nofile, GoVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && k == "MemTotal" {
				if f := strings.Fields(v); len(f) > 0 {
					kb, _ := strconv.ParseInt(f[0], 10, 64)
					m.MemoryMiB = kb >> 10
				}
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}
