package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/bench"
)

// target is one server of the comparison.
type target struct {
	name string
	addr string
	// metrics is the server's /metrics URL, read around each run, or
	// none.
	metrics []string
	results []bench.Result
}

// compare runs the rounds against both in-process servers.
func (o options) compare(ctx context.Context, out output) error {
	noopAddr, stopNoop, err := bench.Serve(bench.NoopServer{})
	if err != nil {
		return err
	}
	defer stopNoop()
	// The TTL rules and telemetry `sluice serve` has by default, so that
	// the memory side does the work it does in production.
	mem, err := bench.NewMemoryService(bench.RulesYAML, memory.Options{TTLMultiplier: backend.DefaultTTLMultiplier})
	if err != nil {
		return err
	}
	defer mem.Close()
	memAddr, stopMem, err := bench.Serve(mem.Service, mem.ServerOptions...)
	if err != nil {
		return err
	}
	defer stopMem()

	noopT := &target{name: "noop", addr: noopAddr}
	memT := &target{name: "memory", addr: memAddr}
	targets := []*target{noopT, memT}
	var redisT *target
	var rs *redisSide
	if o.withRedis() {
		if rs, err = o.startRedis(ctx); err != nil {
			return err
		}
		defer rs.close()
		redisT = &target{name: "redis", addr: rs.addr, metrics: []string{rs.metrics}}
		targets = append(targets, redisT)
	}
	w := out.text
	o.describe(w)
	fmt.Fprintf(w, "compare: %d rounds; noop at %s, memory (Sluice) at %s", o.rounds, noopAddr, memAddr)
	if redisT != nil {
		fmt.Fprintf(w, ", redis (Sluice) at %s on %s", rs.addr, rs.where)
	}
	fmt.Fprint(w, "\n\n")
	header(w)
	ratios := make([]float64, 0, o.rounds)
	var redisMem, redisNoop, trips []float64
	for round := 1; round <= o.rounds; round++ {
		// Forward in odd rounds, reversed in even ones: over two rounds
		// each server's mean position is the same, so a steady drift in
		// the machine's speed favours none.
		order := slices.Clone(targets)
		if round%2 == 0 {
			slices.Reverse(order)
		}
		for _, t := range order {
			start := time.Now()
			r, err := bench.Run(ctx, o.config([]string{t.addr}, t.metrics, bench.SingleKey()))
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round, t.name, err)
			}
			if ctx.Err() != nil {
				return fmt.Errorf("round %d, %s: %w", round, t.name, context.Cause(ctx))
			}
			t.results = append(t.results, r)
			row(w, fmt.Sprint(round), t.name, r)
			errorSummary(w, "  ", r)
			if u := r.Usage; u != nil && u.BackendCallsPerDecision != nil {
				fmt.Fprintf(w, "  redis round trips per decision: %.4f (%s over %.0f decisions)\n",
					*u.BackendCallsPerDecision, formatCounts(u.BackendCallsByOp), u.Decisions)
				trips = append(trips, *u.BackendCallsPerDecision)
			}
			if err := o.record(out, start, round, t.name, r); err != nil {
				return err
			}
		}
		ratios = append(ratios, memT.results[round-1].Throughput/noopT.results[round-1].Throughput)
		if redisT != nil {
			redisMem = append(redisMem, redisT.results[round-1].Throughput/memT.results[round-1].Throughput)
			redisNoop = append(redisNoop, redisT.results[round-1].Throughput/noopT.results[round-1].Throughput)
		}
	}

	fmt.Fprintf(w, "\nmedians over %d rounds:\n", o.rounds)
	fmt.Fprintf(w, "%-8s %12s %10s %10s %10s\n", "server", "req/s", "p50", "p99", "p999")
	for _, t := range targets {
		fmt.Fprintf(w, "%-8s %12.0f %10s %10s %10s\n", t.name,
			median(t.results, func(r bench.Result) float64 { return r.Throughput }),
			micros(median(t.results, func(r bench.Result) float64 { return float64(r.P50) })),
			micros(median(t.results, func(r bench.Result) float64 { return float64(r.P99) })),
			micros(median(t.results, func(r bench.Result) float64 { return float64(r.P999) })))
	}
	thr := func(r bench.Result) float64 { return r.Throughput }
	ratio := median(memT.results, thr) / median(noopT.results, thr)
	fmt.Fprintf(w, "\nper-round throughput ratio memory/noop: %s (median %.3f)\n",
		formatRatios(ratios), median(ratios, func(f float64) float64 { return f }))
	fmt.Fprintf(w, "ratio of median throughputs memory/noop: %.3f (requirement: at least 0.80)\n", ratio)
	if redisT == nil {
		return nil
	}
	id := func(f float64) float64 { return f }
	fmt.Fprintf(w, "\nper-round throughput ratio redis/memory: %s (median %.3f)\n", formatRatios(redisMem), median(redisMem, id))
	fmt.Fprintf(w, "per-round throughput ratio redis/noop: %s (median %.3f)\n", formatRatios(redisNoop), median(redisNoop, id))
	fmt.Fprintf(w, "ratio of median throughputs redis/memory: %.3f (target: at least 0.50)\n",
		median(redisT.results, thr)/median(memT.results, thr))
	fmt.Fprintf(w, "ratio of median throughputs redis/noop: %.3f\n", median(redisT.results, thr)/median(noopT.results, thr))
	fmt.Fprintf(w, "redis round trips per decision (EVALSHA + HGETALL over decisions, measured runs): median %.4f\n", median(trips, id))
	// The backend's own count, over everything the Redis side answered
	// (warmups and each connection's first call included): Scripts are
	// the EVALSHA round trips, and each config-cache miss waited for a
	// read (several may share one HGETALL).
	st := rs.svc.Backend.Stats()
	scripts, misses, failed := st.Scripts.Load(), st.CacheMisses.Load(), st.ScriptErrors.Load()
	decided, err := rs.decisions()
	if err != nil {
		return fmt.Errorf("redis side's metrics: %w", err)
	}
	if decided > 0 {
		fmt.Fprintf(w, "redis backend Stats, warmups included: %d script runs (%d failed), %d config cache misses, %.0f decisions: (Scripts + CacheMisses)/decision %.4f\n",
			scripts, failed, misses, decided, float64(scripts+misses)/decided)
	}
	return nil
}
