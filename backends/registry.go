package backends

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/jsonstr"
)

// Route is a public model id and the backends that serve it.
type Route struct {
	// Name is the public model id.
	Name string
	// Upstream is the model id sent to the backends; it equals Name when
	// the config sets no upstream_model.
	Upstream string
	// PriorityScheduling says the backends schedule by a request's
	// priority (vLLM's --scheduling-policy priority); see AcceptsPriority.
	PriorityScheduling bool
	// ToolCalling says the backends call tools, so tool_choice may ask for it.
	ToolCalling bool
	// NameJSON and UpstreamJSON are Name and Upstream as quoted JSON
	// strings, built once so that rewriting a body is a splice.
	NameJSON     []byte
	UpstreamJSON []byte

	backends []*Backend
	// totalWeight is the sum of the backends' weights, for weighted picks.
	totalWeight int64

	// Fallbacks are the routes tried, in order, when this one's backends
	// all failed or are out.
	Fallbacks []*Route
	// FallbackKeepsModel makes replies served by a fallback name this
	// route's model.
	FallbackKeepsModel bool
	// signals are the scheduler's signals the model uses.
	signals signals
	// adapter is the FNV-1a hash of Upstream, which names a LoRA adapter
	// when the backends serve one under it.
	adapter uint64
	// serves has bit e set for each Endpoint e the model serves.
	serves uint8
	// messages is models[].messages: how the model serves the Messages
	// API, "" leaving it to each backend.
	messages string
	// MaxOutputTokens is the most a Messages API request may ask the
	// model to generate; zero means no limit.
	MaxOutputTokens int64
	// Reasoning is models[].reasoning: how a Messages API request
	// translated to chat completions asks the backends to think
	// (config.ReasoningEffort or ReasoningTemplate); "" or "none" means
	// it does not.
	Reasoning string

	queue config.Queue
	// reserve is the slots kept for tenants under their share
	// (fairshare.go); zero when the route does not count tenants.
	reserve int64
	// queued counts the requests in waitq, for a release to read without
	// its lock.
	queued atomic.Int64
	waitq  waitQueue
	// queueWait observes waits in the queue; nil when not measured.
	queueWait prometheus.Observer
	// placements count the requests scheduled, by why; nil entries when
	// not counted (and on a model of one backend, which is not scheduled).
	placements [numPlacements]prometheus.Counter
}

// AcceptsPriority reports whether a request with this "priority" may be
// sent to the model: any priority when its backends schedule by priority
// (the body is forwarded as is, field included), else only 0, as vLLM
// refuses a non-zero priority unless it runs with --scheduling-policy
// priority. A request refused gets a 400 naming the priority parameter.
// The gateway's own queue orders by priority either way.
func (r *Route) AcceptsPriority(priority int64) bool {
	return priority == 0 || r.PriorityScheduling
}

// Serves reports whether the model serves endpoint e.
func (r *Route) Serves(e Endpoint) bool { return r.serves&(1<<e) != 0 }

// MessagesNative reports whether b serves the route's Messages API
// requests itself, rather than as chat completions translated by the
// gateway: the model's setting, or else the backend's.
func (r *Route) MessagesNative(b *Backend) bool {
	if r.messages != "" {
		return r.messages == config.MessagesNative
	}
	return b.messagesNative
}

// endpointSet maps models[].endpoints to a bit set; none means all.
func endpointSet(names []string) uint8 {
	if len(names) == 0 {
		return 1<<numEndpoints - 1
	}
	var set uint8
	for e, known := range config.ModelEndpoints() {
		if slices.Contains(names, known) {
			set |= 1 << e
		}
	}
	return set
}

// Backends lists the route's backends in config order.
func (r *Route) Backends() []*Backend { return r.backends }

// Registry holds every backend and every model's route, built from one
// configuration. It is read-only once built, so requests read it without
// locks.
type Registry struct {
	backends []*Backend
	routes   map[string]*Route
	ordered  []*Route
	// pollers read the metrics of the backends the scheduler scores on
	// them, one goroutine each, from NewRegistry until Close.
	pollers   []*metricsPoller
	stopPolls chan struct{}
	// metrics are the series the pollers count in; nil counts nothing.
	metrics   *Metrics
	polling   sync.WaitGroup
	closeOnce sync.Once
}

// NewRegistry builds backends and routes from a validated configuration.
// In-process simulated backends start serving at once; Close stops them.
func NewRegistry(cfg *config.Config) (*Registry, error) { return newRegistry(cfg, nil) }

// newRegistry is NewRegistry, with the metrics the pollers count their
// failed reads in (nil counts nothing), given before they start.
func newRegistry(cfg *config.Config, m *Metrics) (*Registry, error) {
	r := &Registry{routes: make(map[string]*Route, len(cfg.Models)), metrics: m}
	byName := make(map[string]*Backend, len(cfg.Backends))
	for _, bc := range cfg.Backends {
		b, err := newBackend(bc)
		if err != nil {
			r.Close()
			return nil, err
		}
		b.Guard(cfg.Server.MaxResponseBytes)
		r.backends = append(r.backends, b)
		byName[bc.Name] = b
	}
	for i, mc := range cfg.Models {
		rt := &Route{Name: mc.Name, Upstream: mc.Name, PriorityScheduling: mc.PriorityScheduling,
			ToolCalling:        mc.ToolCalling,
			FallbackKeepsModel: mc.FallbackKeepsModel, signals: signalsOf(&mc), queue: mc.Queue}
		if mc.UpstreamModel != "" {
			rt.Upstream = mc.UpstreamModel
		}
		rt.adapter = fnv1a([]byte(rt.Upstream))
		rt.serves = endpointSet(mc.Endpoints)
		rt.messages, rt.MaxOutputTokens, rt.Reasoning = mc.Messages, mc.MaxOutputTokens, mc.Reasoning
		rt.NameJSON = quoteJSON(rt.Name)
		rt.UpstreamJSON = quoteJSON(rt.Upstream)
		for j, name := range mc.Backends {
			b, ok := byName[name]
			if !ok {
				r.Close()
				return nil, fmt.Errorf("models[%d].backends[%d]: no backend named %q", i, j, name)
			}
			rt.backends = append(rt.backends, b)
			rt.totalWeight += b.weight
			b.routes = append(b.routes, rt)
		}
		rt.reserve = defaultReserve(mc.Queue.Reserve, rt.backends)
		r.routes[mc.Name] = rt
		r.ordered = append(r.ordered, rt)
	}
	if err := r.startPolling(cfg); err != nil {
		r.Close()
		return nil, err
	}
	for i, mc := range cfg.Models {
		for j, f := range mc.Fallbacks {
			fb, ok := r.routes[f]
			if !ok {
				r.Close()
				return nil, fmt.Errorf("models[%d].fallbacks[%d]: no model named %q", i, j, f)
			}
			r.ordered[i].Fallbacks = append(r.ordered[i].Fallbacks, fb)
		}
	}
	return r, nil
}

// Route returns the route of a public model id, or nil. The lookup does not
// allocate: Go compiles map[string(b)] without a copy.
func (r *Registry) Route(model []byte) *Route {
	return r.routes[string(model)]
}

// Routes lists every route in config order.
func (r *Registry) Routes() []*Route { return r.ordered }

// Backends lists every backend in config order.
func (r *Registry) Backends() []*Backend { return r.backends }

// Ready reports whether every model has at least one healthy backend.
func (r *Registry) Ready() bool {
	for _, rt := range r.ordered {
		ok := false
		for _, b := range rt.backends {
			if b.Healthy() {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// Close stops the metrics pollers, closes idle upstream connections and
// stops simulated backends.
func (r *Registry) Close() error {
	r.closeOnce.Do(func() {
		if r.stopPolls != nil {
			close(r.stopPolls)
		}
	})
	r.polling.Wait()
	var errs []error
	for _, b := range r.backends {
		if err := b.close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// quoteJSON returns s as a JSON string literal, as json.Marshal writes it.
func quoteJSON(s string) []byte { return jsonstr.Append(nil, s) }
