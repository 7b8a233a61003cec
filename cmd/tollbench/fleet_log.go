package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate-dev/tollgate/backends/simulated"
)

// fleetLog is -fleet-log: a line per request of a conversation phase or a scenario, joining
// what the client measured with what the simulated server that ran it did
// (simulated.Options.OnSequence), so that a slow request's time splits into its wait in the
// gateway, its wait in the server's queue and its prefill, cold or warm, at the batch it joined.
type fleetLog struct {
	mu sync.Mutex
	// seqs are the servers' reports not yet joined, by the request's last message, which the
	// scenarios draw at random and so tells their requests apart.
	seqs map[string]seqReport
	file *os.File
	w    *bufio.Writer
	// scenario names the lines written now; empty while no scenario runs, when the servers'
	// reports are dropped.
	scenario string
}

// seqReport is what a server reported of one request.
type seqReport struct {
	server            int
	arrived, admitted time.Time
	running           int
	prompt, cached    int
	prefill           time.Duration
	// elsewhere is, for a request that found less than half its prompt cached, what each
	// server held of it and ran and queued at its admission.
	elsewhere []serverView
}

// serverView is one server's state as a cold request was admitted elsewhere.
type serverView struct {
	Server  int `json:"server"`
	Cached  int `json:"cached"`
	Running int `json:"running"`
	Waiting int `json:"waiting"`
}

// fleetLogLine is a line of the log.
type fleetLogLine struct {
	Scenario string `json:"scenario"`
	// Tenant is a scenario request's project, or a conversation turn's
	// app-A/conversation-N/turn-T.
	Tenant string  `json:"tenant"`
	SentMS float64 `json:"sent_ms"` // since the phase began
	TTFTMS float64 `json:"ttft_ms"`
	EndMS  float64 `json:"end_ms"` // its stream's end, since the phase began
	Error  string  `json:"error,omitempty"`
	// InFlight is how many of the tenant's requests were in flight when it was sent, itself
	// included; zero for a conversation's turn, which has no others.
	InFlight int `json:"in_flight"`
	// Server is -1 when no server reported the request.
	Server    int          `json:"server"`
	GatewayMS float64      `json:"gateway_ms"` // sent to the server's arrival: the gateway's queue and proxying
	WaitMS    float64      `json:"wait_ms"`    // in the server's queue
	Running   int          `json:"running"`
	Prompt    int          `json:"prompt"`
	Cached    int          `json:"cached"`
	PrefillMS float64      `json:"prefill_ms"`
	Elsewhere []serverView `json:"elsewhere,omitempty"`
}

func newFleetLog(path string) (*fleetLog, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create -fleet-log: %w", err)
	}
	return &fleetLog{seqs: map[string]seqReport{}, file: f, w: bufio.NewWriter(f)}, nil
}

// observer is server i's simulated.Options.OnSequence; servers lists every server, for a cold
// request's view of the others.
func (l *fleetLog) observer(i int, servers *[]*simulated.Server) func(simulated.SequenceStat) {
	return func(st simulated.SequenceStat) {
		l.mu.Lock()
		on := l.scenario != ""
		l.mu.Unlock()
		if !on {
			return
		}
		r := seqReport{server: i, arrived: st.Arrived, admitted: st.Admitted, running: st.Running,
			prompt: st.PromptTokens, cached: st.CachedTokens, prefill: st.Prefill}
		if 2*st.CachedTokens < st.PromptTokens {
			for j, s := range *servers {
				c, run, wait := s.CachedPrefix(st.Body)
				r.elsewhere = append(r.elsewhere, serverView{Server: j, Cached: c, Running: run, Waiting: wait})
			}
		}
		key := gjson.GetBytes(st.Body, "messages.@reverse.0.content").Str
		l.mu.Lock()
		l.seqs[key] = r
		l.mu.Unlock()
	}
}

// start names the scenario whose requests are logged from now on.
func (l *fleetLog) start(scenario string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.scenario = scenario
	clear(l.seqs)
}

// add logs a request of tenant whose last message is key, sent at sent and ended at end (the
// phase began at began), when inFlight of the tenant's requests were in flight.
func (l *fleetLog) add(tenant, key string, began, sent, end time.Time, inFlight int, s fleetSample) {
	l.mu.Lock()
	defer l.mu.Unlock()
	line := fleetLogLine{Scenario: l.scenario, Tenant: tenant, SentMS: millis(sent.Sub(began)), TTFTMS: millis(s.ttft),
		EndMS: millis(end.Sub(began)), Server: -1, InFlight: inFlight}
	if s.err != nil {
		line.Error = s.err.Error()
	}
	if r, ok := l.seqs[key]; ok {
		delete(l.seqs, key)
		line.Server, line.GatewayMS, line.WaitMS = r.server, millis(r.arrived.Sub(sent)), millis(r.admitted.Sub(r.arrived))
		line.Running, line.Prompt, line.Cached, line.PrefillMS, line.Elsewhere = r.running, r.prompt, r.cached, millis(r.prefill), r.elsewhere
	}
	b, err := json.Marshal(line)
	if err != nil {
		return // plain fields always marshal
	}
	_, _ = l.w.Write(append(b, '\n')) // a write error surfaces at close
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// close flushes and closes the log.
func (l *fleetLog) close() error {
	if l == nil {
		return nil
	}
	err := l.w.Flush()
	if cerr := l.file.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write -fleet-log: %w", err)
	}
	return nil
}
