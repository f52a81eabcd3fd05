package syncer_test

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/regions"
)

var (
	inRegion    = flag.Bool("regions.inregion", false, "run TestRegionsDecideInRegion, the issue's in-region world (about 55 s, one emulator holding the three regions' tables); with -regions.gateab, the syncs' gates side by side")
	inRegionP99 = flag.Duration("regions.p99", 20*time.Millisecond, "the p99 TestRegionsDecideInRegion holds each region's decisions to after the warm-up")
)

// TestRegionsDecideInRegion runs the world the way the issue tried it:
// three regions, one replica and one sync each, 5 ms to a region's own
// table and 70 ms to the others', a global limit of 200/s with demand at
// 1.5 times it split 80/15/5 and then 5/15/80, sync windows of 3 s, and
// Envoy's 50 ms deadline on each call. After the first two windows (the
// regions' first writes and share reads, on emulators fresh from their
// start) no call may fail, and each region's decisions must hold their
// p99 to -regions.p99. The syncs read every region's usage, sixteen
// queries a region, in each window's first round: let through all at
// once, they held the replicas' writes to their tables for 100 to 300
// ms each window on two shared cores, and the decisions behind them
// (BENCHMARKS.md section 6); they now go four at a time
// (internal/callgate), as sluice sync sends them.
func TestRegionsDecideInRegion(t *testing.T) {
	if !*inRegion {
		// Not in make test: a p99 of 20 ms under Envoy's 50 ms deadline
		// is a target for a quiet machine, and on two cores shared with
		// the rest of the suite and the race detector a stall of the
		// machine past 50 ms fails calls whatever Sluice does. Run by
		// hand it holds the targets (BENCHMARKS.md section 6, "One
		// emulator for the three regions").
		t.Skip("the issue's in-region world: -regions.inregion")
	}
	c := worldConfig{clock: regions.Clock{Window: 3_000, Skew: 200, Hold: 300}, rate: "200/s", near: 5 * time.Millisecond, far: 70 * time.Millisecond,
		shift: 7, end: 15, deadline: 50 * time.Millisecond, replicas: 1, gateAB: *gateAB}
	w := newWorld(t, c)
	win := int(time.Duration(c.clock.Window) * time.Millisecond / tick)
	for _, name := range w.names {
		w.startSync(w.region[name])
	}
	total := 1.5 * w.rate
	w.setDemand(total, map[regions.Region]float64{"us-east-1": 0.80, "eu-west-1": 0.15, "ap-south-1": 0.05})
	first := c.clock.At(time.Now().UnixMilli()) + 1
	time.Sleep(time.Until(time.UnixMilli(c.clock.Start(first))))
	w.start = time.Now()
	ctx, stop := context.WithCancel(context.Background())
	stalls := probeStalls(ctx, w.start, c.end*win)
	wg := w.load(ctx)
	time.Sleep(time.Until(w.start.Add(time.Duration(c.shift*win) * tick)))
	w.setDemand(total, map[regions.Region]float64{"us-east-1": 0.05, "eu-west-1": 0.15, "ap-south-1": 0.80})
	time.Sleep(time.Until(w.start.Add(time.Duration(c.end*win) * tick)))
	stop()
	wg.Wait()

	warm := 2 * win
	afterWarm := func(n int) bool { return n >= warm }
	for _, name := range w.names {
		r := w.region[name]
		p50, p99 := r.lat.quantileOf(0.5, afterWarm), r.lat.quantileOf(0.99, afterWarm)
		nFailed, nAsked := w.sum(warm, c.end*win+1, failed, name), w.sum(warm, c.end*win+1, asked, name)
		t.Logf("%s after the warm-up: %d decisions, p50 %v, p99 %v, %d failed (%d in the warm-up); failed by kind, warm-up included: %v",
			name, nAsked, p50, p99, nFailed, w.sum(0, warm, failed, name), r.kinds)
		var byWindow []string
		for from := 0; from < c.end*win; from += win {
			in := func(n int) bool { return n >= from && n < from+win }
			byWindow = append(byWindow, fmt.Sprintf("%.0f", float64(r.lat.quantileOf(0.99, in).Microseconds())/1000))
		}
		t.Logf("%s: p99 in ms, window by window: %s", name, strings.Join(byWindow, " "))
		slow := r.lat.slowOf(20*time.Millisecond, afterWarm)
		t.Logf("%s: decisions of 20 ms or more after the warm-up: %d admitted, %d denied, %d failed", name, slow[wasAdmitted], slow[wasDenied], slow[wasFailed])
		if c.gateAB {
			// Windows of even slots had the gates; the world starts at
			// slot first.
			gated := func(n int) bool { return n >= warm && (int(first)+n/win)%2 == 0 }
			open := func(n int) bool { return n >= warm && (int(first)+n/win)%2 != 0 }
			t.Logf("%s side by side: gated windows p50 %v, p99 %v; open windows p50 %v, p99 %v", name,
				r.lat.quantileOf(0.5, gated), r.lat.quantileOf(0.99, gated), r.lat.quantileOf(0.5, open), r.lat.quantileOf(0.99, open))
			continue
		}
		if nFailed > 0 {
			t.Errorf("%s: %d of %d decisions after the warm-up failed (the run's first failure: %v)", name, nFailed, nAsked, r.firstErr.Load())
		}
		if p99 > *inRegionP99 {
			t.Errorf("%s: p99 %v after the warm-up, want at most %v", name, p99, *inRegionP99)
		}
	}
	var late []string
	for from := 0; from < c.end*win; from += win {
		var worst time.Duration
		for n := from; n < from+win; n++ {
			worst = max(worst, time.Duration(stalls[n].Load()))
		}
		late = append(late, fmt.Sprintf("%.0f", float64(worst.Microseconds())/1000))
	}
	t.Logf("the test process's 2 ms sleeps, latest wake-up in ms, window by window: %s", strings.Join(late, " "))
	all := w.sum(0, c.end*win, admitted)
	burst := float64(w.limit.Burst) / bucket.Milli
	run := time.Duration(c.end*win)*tick + c.deadline
	if allowed := burst + w.rate*run.Seconds() + 3; float64(all) > allowed {
		t.Errorf("the run: %d admitted, over B + R*T + 3 = %.0f", all, allowed)
	}
	t.Logf("admitted %d over %v: %.3f of B + R*T", all, run, float64(all)/(burst+w.rate*run.Seconds()))
}

// probeStalls sleeps 2 ms at a time until ctx ends and keeps, for each
// tick of the run started at start, how late (ns) its latest wake-up
// was: a decision takes at least as long as the process cannot run.
func probeStalls(ctx context.Context, start time.Time, ticks int) []atomic.Int64 {
	late := make([]atomic.Int64, ticks+1)
	go func() {
		for ctx.Err() == nil {
			before := time.Now()
			time.Sleep(2 * time.Millisecond)
			n := min(int(before.Sub(start)/tick), ticks)
			if n < 0 {
				continue
			}
			if d := int64(time.Since(before) - 2*time.Millisecond); d > late[n].Load() {
				late[n].Store(d)
			}
		}
	}()
	return late
}
