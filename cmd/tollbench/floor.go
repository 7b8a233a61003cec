package main

import (
	"context"
	"fmt"
	"time"
)

// floorLoop is -bare-store's own closed loop: it alternates a plain bare
// proxy (in the DIRECT column), the bare proxy that stores every request
// (cmd/barestore, in the BARE column) and the gateway, and reports the
// CPU per request and throughput of the last two over the plain bare
// proxy's, from one run: what storing each request as the gateway does
// costs by itself, and what the gateway costs in all.
func (b *bench) floorLoop(ctx context.Context, body []byte) error {
	o := b.o
	b.logf("floor: closed loop on %d connections: %d × (%s plain bare, %s bare+store, %s gateway)", o.conns, o.rounds, o.phase, o.phase, o.phase)
	sd := sides{
		eps: [numSides]*endpoint{
			newEndpoint("plain bare proxy", b.plainFastAddr, b.key, o.conns),
			newEndpoint("bare+store", b.bareFastAddr, b.key, o.conns),
			newEndpoint("gateway", b.gatewayAddr, b.key, o.conns),
		},
		fronts: [numSides]*proc{b.plainFast, b.bareFast, b.gateway},
	}
	defer sd.close()
	// The plain bare proxy has served nothing yet.
	if r := runClosedLoop(ctx, sd.eps[direct], body, 8, max(o.warmup, 100*time.Millisecond)); r.OK == 0 {
		return fmt.Errorf("floor: warm-up: no request succeeded through the plain bare proxy: %s", r.FirstError)
	}
	res, cpu, err := b.closedLoops(ctx, sd, body)
	if err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	sec := fmt.Sprintf("floor: closed loop %d conns", o.conns)
	tput := throughputs(res)
	var perReq [numSides]float64
	reqs := okCounts(res)
	for side := range res {
		perReq[side] = perRequest(cpu[side].front, reqs[side])
	}
	const cols = "DIRECT is a plain bare proxy, BARE the one that stores"
	b.rep.add(row{Section: sec, Metric: "CPU/request, bare+store / plain bare", Unit: unitTimes, SideUnit: unitMicros,
		Direct: ptr(perReq[direct]), Bare: ptr(perReq[bare]), Gateway: ptr(perReq[gateway]),
		Value: safeRatio(perReq[bare], perReq[direct]),
		Note:  fmt.Sprintf("%s; gateway / plain bare %.2f×, gateway / bare+store %.2f×", cols, safeRatio(perReq[gateway], perReq[direct]), safeRatio(perReq[gateway], perReq[bare]))})
	b.rep.add(row{Section: sec, Metric: "throughput, bare+store / plain bare", Unit: unitRatio, SideUnit: unitRate,
		Direct: ptr(tput[direct]), Bare: ptr(tput[bare]), Gateway: ptr(tput[gateway]),
		Value: safeRatio(tput[bare], tput[direct]),
		Note:  fmt.Sprintf("%s; gateway / plain bare %.1f%%, gateway / bare+store %.1f%%", cols, 100*safeRatio(tput[gateway], tput[direct]), 100*safeRatio(tput[gateway], tput[bare]))})
	b.errorRow(sec, res)
	b.othersRow(sec, cpu)
	return nil
}

// floorOpenLoops is -bare-store's own open loops: at each of -rates, the
// backend directly (DIRECT), a plain bare proxy (BARE) and the bare proxy
// that stores every request (in the GATEWAY column), so that what storing
// each request as the gateway does costs the latency, above all its tail,
// comes from one run. The goals are the gateway's and do not apply
// to these rows; their ratios are what the floor itself reaches.
func (b *bench) floorOpenLoops(ctx context.Context, body []byte) error {
	o := b.o
	sd := b.floorSides(b.fastAddr, b.plainFast, b.plainFastAddr, b.bareFast, "bare+store", b.bareFastAddr, o.openConns)
	defer sd.close()
	for _, rate := range o.rates {
		rep := loopReport{section: fmt.Sprintf("floor: open loop %d/s", rate), note: "BARE is a plain bare proxy, GATEWAY the one that stores"}
		if err := b.openLoop(ctx, sd, body, rate, rep); err != nil {
			return fmt.Errorf("floor: %w", err)
		}
	}
	return nil
}

// floorStreams is -bare-handover's own stream phase: the backend directly
// (DIRECT), a plain bare proxy (BARE) and the bare proxy that hands its
// streams over as the gateway does (cmd/bareproxy -handover, in the
// GATEWAY column), so that what the hand-over costs a stream by itself
// comes from one run. The goals are the gateway's and do not apply
// to these rows.
func (b *bench) floorStreams(ctx context.Context) error {
	o := b.o
	sd := b.floorSides(b.streamAddr, b.plainStream, b.plainStreamAddr, b.handOverStream, "bare+handover", b.handOverStreamAddr, o.streamConc)
	defer sd.close()
	return b.streamRows(ctx, sd, loopReport{section: fmt.Sprintf("floor: streams %d×%s", o.streamTokens, o.streamITL),
		note: "BARE is a plain bare proxy, GATEWAY the one that hands its streams over"})
}

// floorSides returns the sides of a floor phase in front of the backend
// at backendAddr: the backend directly (DIRECT), the plain bare proxy
// plain at plainAddr (BARE), and the floor proxy floor, called name, at
// floorAddr (in the GATEWAY column).
func (b *bench) floorSides(backendAddr string, plain *proc, plainAddr string, floor *proc, name, floorAddr string, conns int) sides {
	return sides{
		eps: [numSides]*endpoint{
			newEndpoint("direct", backendAddr, b.key, conns),
			newEndpoint("plain bare proxy", plainAddr, b.key, conns),
			newEndpoint(name, floorAddr, b.key, conns),
		},
		fronts: [numSides]*proc{nil, plain, floor},
	}
}
