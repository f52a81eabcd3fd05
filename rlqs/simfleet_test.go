package rlqs

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/rlqs/rlqstest"
)

// fleetRun is what a simulated fleet did.
type fleetRun struct {
	perSecond []uint64 // all Envoys, admitted in each second
	denied    []uint64 // all Envoys, denied in each second
	// writes is every decision that wrote the shared bucket (a take, a
	// refund); assigned every token bucket assignment sent.
	writes, assigned uint64
	steps            []fleetStep
}

// simFleet runs n Envoys, spread over replicas sharing one backend, on
// a simulated clock for seconds: every 10 ms each asks the demand
// demands gives for that second, each response reaches its Envoy 5 ms
// after it is made, and every bucket is reported every reportMs. It
// holds the bound at every step. Without a busy machine's noise it
// measures the policy alone, in a fraction of a second.
func simFleet(t *testing.T, replicas int, rate uint64, n, seconds int, reportMs int64, demands func(sec int) []float64) fleetRun {
	t.Helper()
	run := runFleet(t, fleetSpec{replicas: replicas, rate: rate, n: n, seconds: seconds, reportMs: reportMs, demands: demands})
	var admitted uint64
	for _, s := range run.steps {
		admitted += s.admitted
		if bound := rate + rate*uint64(s.at)/1000 + 1; admitted > bound {
			t.Fatalf("at %d ms: admitted %d, over the bound %d", s.at, admitted, bound)
		}
	}
	return run
}

// fleetSpec is a simulated fleet: replicas sharing one bucket of rate a
// second (burst rate), n Envoys spread over them asking demands(sec)
// each second and reporting every reportMs, for seconds.
type fleetSpec struct {
	replicas   int
	rate       uint64
	n, seconds int
	reportMs   int64
	demands    func(sec int) []float64
	// delay is how long (ms) a response takes to reach its Envoy; nil:
	// 5 ms.
	delay func() int64
	// wrap, when set, stands between the replicas and the shared bucket:
	// a mutant's backend.
	wrap func(backend.Backend) backend.Backend
	// watch, when set, sees the Envoys after each step.
	watch func(at int64, envoys []*simEnvoy)
}

// fleetStep is what all Envoys admitted in one step of a simulated
// fleet, at ms from its start.
type fleetStep struct {
	at       int64
	admitted uint64
}

// runFleet runs the fleet of spec on a simulated clock, every 10 ms, and
// records what its Envoys admitted at each step.
func runFleet(t *testing.T, spec fleetSpec) fleetRun {
	t.Helper()
	now := int64(1_700_000_000_000)
	start := now
	clock := func() int64 { return now }
	mem := memory.New(memory.Options{Now: clock, SweepInterval: -1})
	defer mem.Close()
	var shared backend.Backend = mem
	if spec.wrap != nil {
		shared = spec.wrap(mem)
	}
	be := &writing{Backend: shared}
	svcs := make([]*Service, spec.replicas)
	for i := range svcs {
		svcs[i] = New(rlqstest.OneLimit(t, int(spec.rate)), be, Options{Now: clock})
	}
	delay := spec.delay
	if delay == nil {
		delay = func() int64 { return 5 }
	}
	ctx := context.Background()
	id := map[string]string{"api": "search"}
	envoys := make([]*simEnvoy, spec.n)
	for i := range envoys {
		envoys[i] = newSimEnvoy(svcs[i%spec.replicas], now)
	}
	run := fleetRun{perSecond: make([]uint64, spec.seconds), denied: make([]uint64, spec.seconds)}
	const dt = 10 // ms
	for ; now-start < int64(spec.seconds)*1000; now += dt {
		sec := int((now - start) / 1000)
		d := spec.demands(sec)
		step := fleetStep{at: now - start}
		for i, e := range envoys {
			want, got := e.step(ctx, t, id, now, dt, d[i], spec.reportMs, delay)
			run.perSecond[sec] += got
			run.denied[sec] += want - got
			step.admitted += got
		}
		run.steps = append(run.steps, step)
		if spec.watch != nil {
			spec.watch(step.at, envoys)
		}
	}
	run.writes = be.writes.Load()
	for _, svc := range svcs {
		run.assigned += svc.Stats().TokenBuckets
	}
	return run
}

// writing counts the decisions that write the shared bucket: a take
// allowed, and a refund. A denial or a check writes nothing on any
// backend.
type writing struct {
	backend.Backend
	writes atomic.Uint64
}

func (w *writing) Decide(ctx context.Context, req *backend.Request) (backend.Decision, error) {
	d, err := w.Backend.Decide(ctx, req)
	if err == nil && d.Allowed && (req.Hits > 0 || req.Refund) {
		w.writes.Add(1)
	}
	return d, err
}

// TestShiftingFleetSimulated is the fleet of TestFleetOnOneReplica on a
// simulated clock: ten Envoys asking 1.5 times a limit of 1,000 a second
// (burst 1,000) between them, 70/20/10, the heaviest and a light one
// swapping halfway. For a reporting interval after the start and after
// the swap Sluice cannot know the new demands, and tokens pile up unused
// in the light Envoys' buckets; they come back at the next report, and
// must reach the Envoys short of them rather than be lost: over the run,
// the fleet admits at least 0.9 of B + R*T with Envoy's 5 s reports and
// 0.93 with 1 s reports (with the replica's spares, 0.947 to 0.961 and
// 0.963 to 0.969 in 20 runs; 0.94 to 0.96 with 5 s reports when they
// were refunded to the shared bucket an eighth of its burst at a time).
func TestShiftingFleetSimulated(t *testing.T) {
	const rate, n, seconds = 1000, 10, 60
	for _, c := range []struct {
		reportMs int64
		floor    float64
	}{{5000, 0.9}, {1000, 0.93}} {
		run := simFleet(t, 1, rate, n, seconds, c.reportMs, func(sec int) []float64 {
			d := make([]float64, n)
			for i := range d {
				d[i] = 19
			}
			d[1] = 300
			if sec < seconds/2 {
				d[0] = 1050
			} else {
				d[9] = 1050
			}
			return d
		})
		var total uint64
		for _, a := range run.perSecond {
			total += a
		}
		bound := float64(rate + rate*seconds)
		t.Logf("reports every %d ms: admitted %d, %.3f of B + R*T; %d writes of the shared bucket for %d token buckets sent; each second: %v",
			c.reportMs, total, float64(total)/bound, run.writes, run.assigned, run.perSecond)
		// Over the limit a renewal that cannot pay a second of its
		// Envoy's rate waits rather than cut it down, and may write
		// twice (Policy.renew): 0.91 to 1.02 writes per token bucket
		// sent with 1 s reports, 0.84 to 0.95 with 5 s reports (20
		// runs).
		if float64(run.writes) > 1.1*float64(run.assigned) {
			t.Errorf("reports every %d ms: %d writes of the shared bucket for %d token buckets sent, want at most 1.1 each", c.reportMs, run.writes, run.assigned)
		}
		if float64(total) < c.floor*bound {
			t.Errorf("reports every %d ms: admitted %.3f of B + R*T, want at least %.2f", c.reportMs, float64(total)/bound, c.floor)
		}
	}
}

// Envoys that begin reporting a bucket together, below its limit, on
// one replica or spread over three. Before its first report an Envoy's
// demand is unknown: its first assignment costs at most an eighth of
// what the shared bucket holds, so that every one of them gets some of
// it, and the next a share of the limit by how many began together on
// its replica and, on several, by how much of the bucket's draws were
// its replica's (draws). Few requests are denied before the first
// report; on one replica none after it, on three almost none. The ten
// Envoys at half the limit over three replicas, which had 4.5% to 5.2%
// of their requests denied before the second report with each replica
// counting only its own newcomers (means of three sets of 20 runs, 7.9% at
// worst), have 1.1% (2.6% at worst in 50 runs): at most 5% allowed.
// Writes: one per token bucket sent at most where the Envoys ask up to
// 60% of the limit; at 70% to 80% of it renewals that cannot pay a
// second of a rate wait rather than cut an Envoy below its demand, and
// may write twice (1.02 at worst in 50 runs): 1.05 allowed there.
// Earlier bounds, from 500 runs of each case with a quarter for the
// first assignment: at most 8% of the requests denied before 5 s on one
// replica, 22% on three; after it none of the light Envoys' on one
// replica, at most 0.5% otherwise (one run in 800 reached 1.1%, hence 2%
// allowed): Envoys at 70% to 80% of the limit with a quarter of headroom
// ask for all of it, and the shared bucket runs short now and then while
// their renewals settle.
func TestNewcomersBelowTheLimitSimulated(t *testing.T) {
	for _, c := range []struct {
		replicas, n int
		demand      float64
		first       float64 // of the requests before 5 s, denied at most
		second      float64 // of the requests before 10 s
		after       float64 // of those after 5 s
		writes      float64 // per token bucket sent
	}{
		{1, 10, 50, 0.1, 0.1, 0, 1}, {1, 20, 30, 0.1, 0.1, 0, 1}, {1, 4, 200, 0.1, 0.1, 0.02, 1.05}, {1, 1, 500, 0.1, 0.1, 0, 1.05},
		{3, 10, 50, 0.3, 0.05, 0.02, 1}, {3, 20, 30, 0.3, 0.3, 0.02, 1}, {3, 4, 175, 0.3, 0.3, 0.02, 1.05},
	} {
		const seconds = 30
		run := simFleet(t, c.replicas, 1000, c.n, seconds, 5000, func(sec int) []float64 {
			d := make([]float64, c.n)
			for i := range d {
				d[i] = c.demand
			}
			return d
		})
		var first, second, after uint64
		for s, d := range run.denied {
			if s < 5 {
				first += d
			} else {
				after += d
			}
			if s < 10 {
				second += d
			}
		}
		asked := float64(c.n) * c.demand
		t.Logf("%d replicas, %d Envoys at %.0f a second: denied %d before the first report, %d before the second, %d after the first; %d writes for %d token buckets; in each second: %v",
			c.replicas, c.n, c.demand, first, second, after, run.writes, run.assigned, run.denied)
		if float64(run.writes) > c.writes*float64(run.assigned) {
			t.Errorf("%d replicas, %d Envoys at %.0f a second: %d writes of the shared bucket for %d token buckets sent, want at most %.2f each", c.replicas, c.n, c.demand, run.writes, run.assigned, c.writes)
		}
		if f := float64(first) / (5 * asked); f > c.first {
			t.Errorf("%d replicas, %d Envoys at %.0f a second: %.3f of the requests before the first report denied, want at most %.2f", c.replicas, c.n, c.demand, f, c.first)
		}
		if f := float64(second) / (10 * asked); f > c.second {
			t.Errorf("%d replicas, %d Envoys at %.0f a second: %.3f of the requests before the second report denied, want at most %.2f", c.replicas, c.n, c.demand, f, c.second)
		}
		if f := float64(after) / ((seconds - 5) * asked); f > c.after {
			t.Errorf("%d replicas, %d Envoys at %.0f a second: %.4f of the requests after the first report denied, want at most %.3f", c.replicas, c.n, c.demand, f, c.after)
		}
	}
}
