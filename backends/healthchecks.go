package backends

import (
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// healthTick is how often the checker looks for probes that are due. Each
// backend is probed at its own interval, and an ejected one as soon as its
// cooldown has passed, so the tick only bounds how late a probe can be.
const healthTick = 250 * time.Millisecond

// HealthChecker probes the backends of a registry with GET <url><path>
// (by default /models, which every OpenAI-compatible server answers). It
// runs one goroutine, stopped by Stop.
type HealthChecker struct {
	reg  *Registry
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// StartHealthChecks probes every backend at once, then each at its
// configured interval, until Stop.
func (r *Registry) StartHealthChecks() *HealthChecker {
	h := &HealthChecker{reg: r, stop: make(chan struct{}), done: make(chan struct{})}
	go h.run()
	return h
}

// Stop ends the checks and waits for the goroutine to return.
func (h *HealthChecker) Stop() {
	h.once.Do(func() { close(h.stop) })
	<-h.done
}

func (h *HealthChecker) run() {
	defer close(h.done)
	t := time.NewTicker(healthTick)
	defer t.Stop()
	for {
		h.probeDue(time.Now())
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
	}
}

// probeDue probes, concurrently, every backend whose probe is due, so one
// slow backend does not delay the verdict on the others, and waits for
// them.
func (h *HealthChecker) probeDue(now time.Time) {
	var wg sync.WaitGroup
	for _, b := range h.reg.backends {
		// An ejected backend is probed only once its cooldown has passed;
		// any other at its own interval.
		if b.health.ejected.Load() {
			if !b.health.dueForProbe(now) {
				continue
			}
		} else if now.UnixNano() < b.nextProbe {
			continue
		}
		b.nextProbe = now.Add(b.health.cfg.Interval).UnixNano()
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.health.probed(b.probe() == nil, time.Now())
		}()
	}
	wg.Wait()
}

// probe sends one health request.
func (b *Backend) probe() error {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURIBytes(b.healthURL)
	req.Header.SetMethod(fasthttp.MethodGet)
	if b.authorization != nil {
		req.Header.SetBytesV(fasthttp.HeaderAuthorization, b.authorization)
	}
	if err := b.client.DoTimeout(req, resp, b.health.cfg.Timeout); err != nil {
		return classify(err)
	}
	if code := resp.StatusCode(); code < 200 || code > 299 {
		return errUnhealthyStatus
	}
	return nil
}
