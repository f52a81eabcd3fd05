package rlqs

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/sluice-rl/sluice/backend"
)

// span is a stretch of a simulated fleet's steps: from the step at from
// to the one at to (ms), what its Envoys admitted in them, and by how
// much that passed B + R*T + 1, T = to - from.
type span struct {
	from, to int64
	admitted uint64
	excess   float64
}

// worstSpan is the span of steps, over every start and every end, whose
// admissions pass B + R*T + 1 the most (burst and rate of the bucket).
// Admitted in steps a..j less R*T is (A_j - R*t_j) - (A_{a-1} - R*t_a),
// A the running total, so one pass keeping the least of the second term
// finds it.
func worstSpan(steps []fleetStep, rate, burst uint64) span {
	worst := span{excess: -1e18}
	var total uint64 // admitted up to the step before
	var low int64    // least of 1000*A_{a-1} - rate*t_a so far
	lowAt, lowTotal := int64(0), uint64(0)
	for j, s := range steps {
		if m := 1000*int64(total) - int64(rate)*s.at; j == 0 || m < low {
			low, lowAt, lowTotal = m, s.at, total
		}
		total += s.admitted
		if e := float64(1000*int64(total)-int64(rate)*s.at-low)/1000 - float64(burst+1); e > worst.excess {
			worst = span{from: lowAt, to: s.at, admitted: total - lowTotal, excess: e}
		}
	}
	return worst
}

// unpaid is the mutant whose takes never reach the shared bucket: each
// is checked against it, and allowed.
type unpaid struct{ backend.Backend }

func (u unpaid) Decide(ctx context.Context, req *backend.Request) (backend.Decision, error) {
	if req.Hits == 0 || req.Refund {
		return u.Backend.Decide(ctx, req)
	}
	check := *req
	check.Hits = 0
	d, err := u.Backend.Decide(ctx, &check)
	d.Allowed = true
	return d, err
}

// phasedDemands is a fleet's demand, second by second, for seconds: a
// run of phases of 2 to 30 s each, the Envoys idle (long enough, now and
// then, for their buckets to be abandoned), below the limit, or far
// over it.
func phasedDemands(rng *rand.Rand, n, seconds int, rate float64) [][]float64 {
	out := make([][]float64, 0, seconds)
	for len(out) < seconds {
		length := 2 + rng.IntN(29)
		var total float64
		switch rng.IntN(4) {
		case 0: // idle
			if rng.IntN(3) == 0 {
				length = 31 + rng.IntN(10)
			}
		case 1, 2:
			total = rate * (0.3 + 0.65*rng.Float64())
		case 3:
			total = rate * (1.5 + 2.5*rng.Float64())
		}
		w := make([]float64, n)
		var sum float64
		for i := range w {
			w[i] = rng.Float64()
			sum += w[i]
		}
		for range length {
			d := make([]float64, n)
			for i := range d {
				d[i] = total * w[i] / sum
			}
			out = append(out, d)
		}
	}
	return out[:seconds]
}

// spanFigure is how far Envoys may pass B + R*T + 1 over a span that
// starts at some instant (docs/rlqs.md, The bound): the tokens Sluice
// took for them and they had not admitted then. Each Envoy holds at most
// r*(TTL + ShortTTL + 2*Allowance + report interval) + 3*b + 2 of them, r
// and b the largest tokens_per_fill and max_tokens its bucket was
// assigned since its slot began, and each replica's spares at most the
// bucket's burst.
func spanFigure(p Policy, reportMs int64, replicas int, burst uint64, rates, bursts []uint64) float64 {
	p = p.withDefaults()
	w := float64((p.TTL+p.ShortTTL+2*p.Allowance).Milliseconds()+reportMs) / 1000
	f := float64(uint64(replicas) * burst)
	for i, r := range rates {
		f += float64(r)*w + float64(3*bursts[i]+2)
	}
	return f
}

// held is what Sluice holds for envoys' buckets by its own books: every
// slot's bank and what it issued beyond what its Envoy reported
// admitted, and the spares of every replica. Envoys may admit all of it
// after any instant, on top of what the shared bucket gives from then.
func held(envoys []*simEnvoy) float64 {
	var n float64
	seen := map[*Service]bool{}
	for _, e := range envoys {
		for _, s := range e.st.slots {
			n += float64(s.bank) + float64(s.issued) - float64(s.allowed)
		}
		if svc := e.st.svc; !seen[svc] {
			seen[svc] = true
			for _, k := range svc.spares.held.Keys() {
				v, _ := svc.spares.held.Peek(k)
				n += float64(v)
			}
		}
	}
	return n
}

// spanRun is one seed's simulated fleet, checked over every span.
type spanRun struct {
	n, replicas int
	reportMs    int64
	worst       span // over every span
	// tightest is the most any span from an instant used of what Sluice
	// held then; over counts the instants from which some span passed
	// it, overWorst the span that passed it most.
	tightest  float64
	over      int
	overWorst span
	// books is the most Sluice held, as a part of spanFigure then;
	// overFigure the instants it held more than spanFigure.
	books      float64
	overFigure int
}

// simulateSpans runs seed's fleet of 2 to 10 Envoys on 1 to 3 replicas,
// 1 s or 5 s reports, through phasedDemands for 150 s with responses 5 to
// 305 ms late, and checks, from every step, the worst span from it
// against what Sluice held after the step before, and that against
// spanFigure. wrap, when set, is a mutant's backend.
func simulateSpans(t *testing.T, seed uint64, wrap func(backend.Backend) backend.Backend) spanRun {
	const rate, seconds = 1000, 150
	rng := rand.New(rand.NewPCG(seed, 36))
	r := spanRun{n: 2 + rng.IntN(9), replicas: 1 + rng.IntN(3), reportMs: []int64{1000, 5000}[rng.IntN(2)]}
	demand := phasedDemands(rng, r.n, seconds, rate)
	rates, bursts := make([]uint64, r.n), make([]uint64, r.n)
	slots := make([]*slot, r.n)
	var books []float64 // after each step: what Sluice held
	run := runFleet(t, fleetSpec{replicas: r.replicas, rate: rate, n: r.n, seconds: seconds, reportMs: r.reportMs,
		demands: func(sec int) []float64 { return demand[sec] },
		delay:   func() int64 { return 5 + int64(rng.IntN(300)) },
		wrap:    wrap,
		watch: func(_ int64, envoys []*simEnvoy) {
			for i, e := range envoys {
				var s *slot
				for _, s = range e.st.slots {
				}
				if s != slots[i] {
					// A new slot (the first, or after its bucket was
					// abandoned and what it held stranded).
					slots[i], rates[i], bursts[i] = s, 0, 0
				}
				if s != nil && s.active != nil && !s.active.Allow {
					rates[i] = max(rates[i], s.active.PerSecond)
					bursts[i] = max(bursts[i], s.active.MaxTokens)
				}
			}
			h := held(envoys)
			books = append(books, h)
			f := spanFigure(Policy{}, r.reportMs, r.replicas, rate, rates, bursts)
			r.books = max(r.books, h/f)
			if h > f {
				r.overFigure++
			}
		}})
	r.worst = worstSpan(run.steps, rate, rate)
	// From each step a, the worst span ending at j >= a: a suffix maximum
	// of 1000*A_j - rate*t_j.
	steps := run.steps
	cum := make([]int64, len(steps)+1)
	for i, s := range steps {
		cum[i+1] = cum[i] + int64(s.admitted)
	}
	best, bestAt := int64(-1<<62), 0
	for a := len(steps) - 1; a >= 0; a-- {
		if m := 1000*cum[a+1] - rate*steps[a].at; m > best {
			best, bestAt = m, a
		}
		excess := float64(best-(1000*cum[a]-rate*steps[a].at))/1000 - (rate + 1)
		allowed := 0.0 // nothing taken before the first step
		if a > 0 {
			allowed = books[a-1]
		}
		if allowed > 0 {
			r.tightest = max(r.tightest, excess/allowed)
		}
		if excess > allowed {
			r.over++
			if r.over == 1 || excess-allowed > r.overWorst.excess {
				r.overWorst = span{from: steps[a].at, to: steps[bestAt].at, admitted: uint64(cum[bestAt+1] - cum[a]), excess: excess - allowed}
			}
		}
	}
	return r
}

// TestSpansOfAssignmentsSimulated holds the RLQS span bound of
// docs/rlqs.md over every span, from every instant of a simulated fleet
// and not only from its first request: Envoys admit at most B + R*T + 1
// plus the tokens taken for them and not admitted when the span began,
// bounded by what Sluice assigned them (spanFigure). The fleets go idle
// (their buckets abandoned, now and then), run below the limit with the
// shared bucket refilling to full while their assignments are paid, and
// far over it, on up to three replicas with responses up to 305 ms late.
func TestSpansOfAssignmentsSimulated(t *testing.T) {
	var worst span
	var tightest, books float64
	for seed := range uint64(20) {
		r := simulateSpans(t, seed, nil)
		t.Logf("seed %d: %d Envoys on %d replicas, reports every %d ms: worst span %d..%d ms admitted %d, %.0f over B + R*T + 1; the closest span came to %.2f of what Sluice held at its start, which came to %.2f of the figure",
			seed, r.n, r.replicas, r.reportMs, r.worst.from, r.worst.to, r.worst.admitted, r.worst.excess, r.tightest, r.books)
		if r.over > 0 {
			t.Errorf("seed %d: from %d instants the Envoys passed B + R*T + 1 and what Sluice held; by %.0f at most, from %d ms to %d ms (%d admitted)",
				seed, r.over, r.overWorst.excess, r.overWorst.from, r.overWorst.to, r.overWorst.admitted)
		}
		if r.overFigure > 0 {
			t.Errorf("seed %d: at %d steps Sluice held more than the figure", seed, r.overFigure)
		}
		if r.worst.excess > worst.excess {
			worst = r.worst
		}
		tightest = max(tightest, r.tightest)
		books = max(books, r.books)
	}
	t.Logf("worst excess over B + R*T + 1 in 20 seeds: %.0f (%d admitted from %d ms to %d ms); the closest any span came to what Sluice held at its start: %.2f; what Sluice held came to %.2f of the figure at most",
		worst.excess, worst.admitted, worst.from, worst.to, tightest, books)
}

// TestSpansCatchUnpaidAssignments: assignments whose tokens never leave
// the shared bucket pass B + R*T + 1 and what Sluice held. A fleet that
// never asks more than the limit admits no more than it unpaid (5 of the
// 20 seeds), and one seed passes B + R*T + 1 by less than Sluice held:
// 14 of 20 caught when this was written, at least 12 wanted.
func TestSpansCatchUnpaidAssignments(t *testing.T) {
	caught := 0
	const seeds = 20
	for seed := range uint64(seeds) {
		r := simulateSpans(t, seed, func(b backend.Backend) backend.Backend { return unpaid{b} })
		if r.over > 0 {
			caught++
		}
		t.Logf("seed %d: passed B + R*T + 1 and what Sluice held from %d instants, by %.0f at most; %.0f over B + R*T + 1 at worst", seed, r.over, r.overWorst.excess, r.worst.excess)
	}
	t.Logf("caught in %d of %d seeds", caught, seeds)
	if caught < seeds*3/5 {
		t.Errorf("unpaid assignments passed the figure in %d of %d seeds, want at least 3 in 5", caught, seeds)
	}
}
