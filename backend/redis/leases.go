package redis

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// With leases (Options.LeaseHorizon), a replica spends tokens it has
// moved out of a Redis bucket from its own memory (backend.Leases, as
// the DynamoDB backend does): the decision script takes a lease's grant
// in the same atomic run that decides a call (a lease call, decide.lua),
// and takes back what a lease returns, so no token is admitted that has
// not left the shared bucket. A call its lease pays costs no round trip;
// a replica far from its Redis decides locally.

// backgroundTimeout bounds a lease call's run once its callers may have
// stopped waiting, a renewal's and a return's.
const backgroundTimeout = 5 * time.Second

// closeTimeout bounds how long Close waits for the runs in flight, and
// then how long it spends returning leases.
const closeTimeout = 5 * time.Second

// maxDenyAge is how old (ms) the last state a replica saw of a bucket
// may be for a denial to be decided from it (and its lease) without a
// run: as the DynamoDB backend's MaxDenyStaleness default.
const maxDenyAge = 1000

// errBeyondReach answers a call whose deadline is nearer than Redis's
// measured round trip: as a deadline, for the failure policy.
var errBeyondReach = fmt.Errorf("redis's round trip is longer than the time left to the deadline: %w", context.DeadlineExceeded)

// errClosed answers the calls that come after Close.
var errClosed = errors.New("redis backend closed")

// view is a bucket as a lease call's run left it, for backend.Leases.
type view struct {
	cfg     string
	limits  []bucket.Limit
	states  []bucket.State
	expires int64 // ms; 0: never
}

func (v *view) StateOf(name string) (bucket.State, bool) {
	for i, l := range v.limits {
		if l.Name == name {
			return v.states[i], true
		}
	}
	return bucket.State{}, false
}

func (v *view) Expired(now int64) bool { return v.expires != 0 && v.expires <= now }

func (v *view) Config() string { return v.cfg }

// leasedDecide decides req on buckets bs (their limits resolved as res)
// with this replica's leases: from a lease when it can pay; denied at
// once when Redis is farther than the deadline and the lease is spent
// or short; else in a lease call whose run outlives the caller.
func (b *Backend) leasedDecide(ctx context.Context, req *backend.Request, res []backend.Resolved, bs []scriptBucket, limits []bucket.Limit, level backend.Level) (backend.Decision, error) {
	lbs := make([]backend.LeaseBucket[string], len(bs))
	for i := range bs {
		lbs[i] = backend.LeaseBucket[string]{Key: bs[i].key, Res: res[i], FP: bs[i].cfg}
	}
	now, rtt := b.opts.Now(), b.rtt.Ms()
	// A charge is never denied here, nor answered by the failure
	// policy: a lease that holds it pays it, and any other goes to Redis
	// whole (into debt there), in a run that outlives its caller, so that
	// it lands even after Envoy, which ignores the answer, has given up.
	charge := req.Charge && !req.Refund
	paying := !req.Refund && req.Hits > 0 && !charge
	if charge {
		b.leases.Charged(lbs, now)
	}
	if !req.Refund {
		if results, renew, paid := b.leases.Spend(lbs, req.Hits, now, rtt, true); paid {
			b.renew(renew)
			b.stats.LocalAnswers.Add(1)
			return backend.Decision{Allowed: true, Limits: limits, Results: results,
				Binding: bucket.Binding(limits, results), Level: level}, nil
		}
	}
	if charge && req.Hits > 0 {
		// What the lease holds goes into the charge, Redis gets the
		// rest: sent whole, it would leave the lease to pass checks
		// however deep in debt the bucket is.
		req = b.leases.Charging(lbs, req, now)
	}
	if paying {
		if results, denied := b.leases.DenyFromView(lbs, req.Hits, now, maxDenyAge); denied {
			// Denials stay local: a bucket seen unable to pay, a moment
			// ago, still cannot.
			b.stats.LocalAnswers.Add(1)
			return backend.Decision{Limits: limits, Results: results,
				Binding: bucket.Binding(limits, results), Level: level}, nil
		}
		if d, ok := ctx.Deadline(); ok && rtt > 0 && time.Until(d) < time.Duration(rtt)*time.Millisecond {
			// No run can be back before this call's deadline. A spent
			// lease with its grant on the way is all this replica may
			// admit until it lands; a lease that could not last a round
			// trip marks a bucket at its limit: both deny, while Redis
			// answered lately. Anything else is for the failure policy.
			results, low, paid, outrun := b.leases.Beyond(lbs, req.Hits, now, rtt, func() { b.renewNow(lbs) })
			if paid {
				b.renew(low)
				b.stats.LocalAnswers.Add(1)
				return backend.Decision{Allowed: true, Limits: limits, Results: results,
					Binding: bucket.Binding(limits, results), Level: level}, nil
			}
			if b.leases.SeenWithin(lbs, now, maxDenyAge) && (outrun || b.leases.Short(lbs, now, rtt)) {
				return b.deadlineDenial(req, limits, level), nil
			}
			return backend.Decision{}, fmt.Errorf("redis: bucket %q/%q: %w", req.Entity, req.Resource, errBeyondReach)
		}
	}
	p := &pending{buckets: bs}
	p.call = scriptCall{refund: req.Refund, lease: !req.Refund, charge: charge, costs: costs(req, limits, p.costBuf[:0])}
	// The run may outlive this call, and its caller may reuse req once
	// Decide returns: the run reads a copy.
	rq := *req
	lc := &leaseCall{p: p, lbs: lbs, req: &rq, limits: limits, done: make(chan struct{})}
	if !req.Refund {
		p.landed = func(p *pending) { p.held = b.creditHeld(lbs, lc.reps, p) }
		off := 0
		lc.reps = make([]*backend.LeaseReport, len(lbs))
		for i := range lbs {
			n := len(lbs[i].Res.Limits)
			// The call folds the lease and reports on it, unless another
			// run carries its report: then the lease's tokens stay with
			// it, and the call grants nothing (the grant would be counted
			// out where that report's answer does not know of it).
			back, rep, folds := b.leases.Fold(&lbs[i])
			if back == nil {
				back = make([]int64, n)
			}
			// One grant on the way per lease: the calls that miss it
			// together (one run, or runs in flight at once) would each
			// take a lease's worth, and the replica would hold many.
			var want []int64
			if folds {
				lc.reps[i] = &rep
				if b.leases.StartRenewal(&lbs[i]) {
					lc.granting = append(lc.granting, lbs[i].Key)
					want = b.leases.Wants(&lbs[i], p.call.costs[off:off+n], now, rtt)
				}
			}
			if want == nil {
				want = make([]int64, n)
			}
			p.call.back = append(p.call.back, back...)
			p.call.want = append(p.call.want, want...)
			p.call.addReport(rep, nil, n, b.leases.NextWindow(now))
			off += n
		}
	}
	if !b.detach(ctx, lc) {
		b.idle(lc)
		b.settleLost(lc, true)
		return backend.Decision{}, fmt.Errorf("redis: bucket %q/%q: %w", req.Entity, req.Resource, errClosed)
	}
	select {
	case <-lc.done:
	case <-ctx.Done():
		if lc.state.CompareAndSwap(callPending, callAbandoned) {
			err := fmt.Errorf("redis: bucket %q/%q: %w", req.Entity, req.Resource, ctx.Err())
			now := b.opts.Now()
			if paying && b.leases.SeenWithin(lbs, now, maxDenyAge) && (b.leases.Outrun(lbs, now) || b.leases.Short(lbs, now, b.rtt.Ms())) {
				return b.deadlineDenial(req, limits, level), nil
			}
			return backend.Decision{}, err
		}
		<-lc.done // answered just as ctx ended: the answer stands
	}
	if lc.err != nil {
		return backend.Decision{}, fmt.Errorf("redis: bucket %q/%q: %w", req.Entity, req.Resource, lc.err)
	}
	return backend.Decision{Allowed: p.allowed, Limits: limits, Results: lc.results,
		Binding: bucket.Binding(limits, lc.results), Level: level}, nil
}

// The states of a lease call's hand-shake: the run answers a pending
// call, or its caller abandons it first (and is answered by the failure
// policy); whichever moves first decides who takes the answer.
const (
	callPending int32 = iota
	callAnswered
	callAbandoned
)

// leaseCall is a decision's lease call in flight.
type leaseCall struct {
	p      *pending
	lbs    []backend.LeaseBucket[string]
	req    *backend.Request
	limits []bucket.Limit
	// granting are the leases whose grant this call asks for (marked
	// busy, as a renewal, until it is credited); reps, per lease, the
	// report the call carries on it (nil: none).
	granting []string
	reps     []*backend.LeaseReport
	state    atomic.Int32
	done     chan struct{}
	// The answer, set before done closes.
	results []bucket.Result
	err     error
}

// detach runs lc's call on a goroutine of its own, under a context that
// outlives the caller's (backgroundTimeout, and Close): a run abandoned
// by its caller's deadline still lands, and what it took goes into the
// lease. It reports false, having done nothing, once Close has begun.
func (b *Backend) detach(ctx context.Context, lc *leaseCall) bool {
	return b.bg.Go(func() {
		defer close(lc.done)
		defer b.idle(lc)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), backgroundTimeout)
		defer cancel()
		stop := context.AfterFunc(b.bg.Context(), cancel)
		defer stop()
		lc.p.ctx = rctx
		start := time.Now()
		err := b.run(rctx, lc.p)
		if err == nil {
			b.rtt.Observe(time.Since(start))
		}
		b.settle(lc, err)
	})
}

// settle answers lc, whose run credited the leases as it landed
// (creditHeld), or, when its caller has gone, counts the tokens its
// admission took as dropped.
func (b *Backend) settle(lc *leaseCall, err error) {
	p := lc.p
	now := p.now
	if err == nil {
		err = p.err
	}
	if err != nil {
		b.settleLost(lc, false)
		lc.err = err
		lc.state.CompareAndSwap(callPending, callAnswered)
		return
	}
	if lc.req.Refund {
		lc.results, lc.err = resultsOf(lc.req, lc.limits, p.call.costs, nil, p.after, p.allowed, p.holds, now)
		lc.state.CompareAndSwap(callPending, callAnswered)
		return
	}
	// An admission reports the bucket with what the leases hold on top,
	// as a call they pay does: the lease this call withdrew came back in
	// its run, but a renewal Redis ran before it may have filled the
	// lease since (its grant is not in the bucket any more). A denial
	// took no grant, and its lease went back into the bucket.
	held := p.granted
	if p.allowed {
		held = p.held
	}
	lc.results, lc.err = resultsOf(lc.req, lc.limits, p.call.costs, held, p.after, p.allowed, p.holds, now)
	if !lc.state.CompareAndSwap(callPending, callAnswered) && p.allowed && lc.req.Hits > 0 && !p.call.charge {
		// Its caller had gone: the tokens its admission took are lost.
		// They left the bucket as spent, not as a lease, so a lease that
		// spent them later could spend them on top of a bucket refilled
		// meanwhile.
		b.leases.Drop(p.call.costs)
	}
}

// idle clears the marks of the leases lc asked a grant for.
func (b *Backend) idle(lc *leaseCall) {
	for _, k := range lc.granting {
		b.leases.Idle(k)
	}
}

// settleLost counts as dropped what a lease call took out of its lease
// to give back when its run failed: whether the run landed or not, the
// lease no longer has it. The reports it carried are the leases' again
// when the run certainly did not land (sure), and lost otherwise.
func (b *Backend) settleLost(lc *leaseCall, sure bool) {
	b.leases.Drop(lc.p.call.back)
	for i, rep := range lc.reps {
		if rep != nil {
			b.leases.Unreported(&lc.lbs[i], *rep, sure)
		}
	}
}

// creditHeld credits p's run to the leases of lbs (credit, as it lands)
// and returns what they hold then, per limit of lbs one after the other.
func (b *Backend) creditHeld(lbs []backend.LeaseBucket[string], reps []*backend.LeaseReport, p *pending) []int64 {
	b.credit(lbs, reps, p, p.now)
	var held []int64
	for i := range lbs {
		h := b.leases.Peek(&lbs[i])
		if h == nil {
			h = make([]int64, len(lbs[i].Res.Limits))
		}
		held = append(held, h...)
	}
	return held
}

// credit gives each lease of lbs what p's run granted it, with the bucket
// as the run left it, and counts what p gave back, and what of it the
// burst cut off (a bucket that refilled while the lease was out).
func (b *Backend) credit(lbs []backend.LeaseBucket[string], reps []*backend.LeaseReport, p *pending, now int64) {
	off := 0
	for i := range lbs {
		lb := &lbs[i]
		n := len(lb.Res.Limits)
		if i < len(reps) && reps[i] != nil {
			var kept []int64
			if p.kept != nil {
				kept = p.kept[off : off+n : off+n]
			}
			var grant []int64
			if p.granted != nil {
				grant = p.granted[off : off+n : off+n]
			}
			b.leases.Reported(lb, kept, grant, p.call.newWin[off], now)
		}
		v := &view{cfg: lb.FP, limits: lb.Res.Limits, states: p.after[off : off+n : off+n]}
		if ttl := p.buckets[i].ttlMs; ttl > 0 {
			v.expires = now + ttl
		}
		var grant []int64
		if p.granted != nil {
			grant = p.granted[off : off+n : off+n]
		}
		b.leases.Credit(lb, grant, v, nil, now)
		for j := off; j < off+n && j < len(p.call.back); j++ {
			var cut int64
			if j < len(p.cut) {
				cut = p.cut[j]
			}
			if back := p.call.back[j] - cut; back > 0 {
				b.stats.Returned.Add(uint64(back))
			}
			if cut > 0 {
				b.stats.LeaseCut.Add(uint64(cut))
			}
		}
		off += n
	}
	if slicesAny(p.granted) || slicesAny(p.call.back) {
		b.stats.LeaseWrites.Add(1)
	}
}

func slicesAny(v []int64) bool {
	for _, x := range v {
		if x != 0 {
			return true
		}
	}
	return false
}

// deadlineDenial denies req, not decided by Redis, at its deadline, and
// counts it.
func (b *Backend) deadlineDenial(req *backend.Request, limits []bucket.Limit, level backend.Level) backend.Decision {
	results := make([]bucket.Result, len(limits))
	for j, l := range limits {
		c := bucket.Cost(l, req.Hits)
		results[j] = bucket.Result{Cost: c, Wait: bucket.Wait(l, bucket.State{}, c, b.opts.Now())}
	}
	b.stats.DeadlineDenials.Add(1)
	return backend.Decision{Limits: limits, Results: results, Binding: bucket.Binding(limits, results), Level: level}
}

// renew starts a renewal of each lease of lbs (marked busy by Spend).
func (b *Backend) renew(lbs []backend.LeaseBucket[string]) {
	for _, lb := range lbs {
		if !b.bg.Go(func() { b.background(b.bg.Context(), lb, false) }) {
			b.leases.Idle(lb.Key)
		}
	}
}

// renewNow starts a renewal of the lease on every bucket of lbs that has
// none under way: calls that could not wait for a run of their own still
// fill the lease, through their demand, for the calls after them.
func (b *Backend) renewNow(lbs []backend.LeaseBucket[string]) {
	for i := range lbs {
		if b.leases.StartRenewal(&lbs[i]) {
			b.renew(lbs[i : i+1])
		}
	}
}

// background renews lb's lease (a lease call that costs nothing and asks
// for a grant) or gives it back (one that returns it and asks for
// nothing), and clears the lease's busy mark after.
func (b *Backend) background(ctx context.Context, lb backend.LeaseBucket[string], giveBack bool) {
	defer b.leases.Idle(lb.Key)
	ctx, cancel := context.WithTimeout(ctx, backgroundTimeout)
	defer cancel()
	n := len(lb.Res.Limits)
	p := &pending{ctx: ctx, buckets: []scriptBucket{b.plan(lb.Res, lb.Key)}}
	p.call = scriptCall{lease: true, costs: make([]int64, n)}
	now := b.opts.Now()
	var rep backend.LeaseReport
	var keep []int64
	var ok bool
	if giveBack {
		p.call.back, rep, ok = b.leases.Fold(&lb)
		if !ok || (p.call.back == nil && rep.Window == 0) {
			if ok {
				b.leases.Unreported(&lb, rep, true)
			}
			return
		}
	} else {
		// A renewal that asks for nothing (a bucket at its limit) still
		// runs: it reads the bucket, so that the calls this replica
		// cannot send to Redis in time are denied from a recent view
		// rather than left to the failure policy once it has aged. It
		// reports on the lease, whose tokens stay out in the new window.
		if keep, rep, ok = b.leases.Renewing(&lb); !ok {
			return
		}
		p.call.want = b.leases.Wants(&lb, nil, now, b.rtt.Ms())
	}
	p.call.addReport(rep, keep, n, b.leases.NextWindow(now))
	p.landed = func(p *pending) { b.credit([]backend.LeaseBucket[string]{lb}, []*backend.LeaseReport{&rep}, p, p.now) }
	start := time.Now()
	if err := b.run(ctx, p); err != nil || p.err != nil {
		b.leases.Drop(p.call.back)
		b.leases.Unreported(&lb, rep, false)
		return
	}
	b.rtt.Observe(time.Since(start))
}

// addReport appends to c, for a bucket of n limits, the report rep on its
// lease, what of it the lease keeps (nil: nothing), and the window of the
// lease the call takes.
func (c *scriptCall) addReport(rep backend.LeaseReport, keep []int64, n int, newWin int64) {
	for j := range n {
		c.out = append(c.out, at(rep.Out, j))
		c.keep = append(c.keep, at(keep, j))
		c.win = append(c.win, rep.Window)
		c.newWin = append(c.newWin, newWin)
	}
}

// returnLease gives lb's lease back to its bucket (Leases.Sweep, Close).
func (b *Backend) returnLease(ctx context.Context, lb backend.LeaseBucket[string]) {
	b.background(ctx, lb, true)
}

// returnLeases gives every lease back, once the runs in flight have
// landed (Background.Close).
func (b *Backend) returnLeases() error {
	if b.leases == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	b.leases.ReturnAll(ctx, b.leases.All(), b.returnLease)
	if left := b.stats.LeaseOutstanding.Load(); left > 0 {
		return fmt.Errorf("redis backend: %d millitokens of leases could not be returned", left)
	}
	return nil
}
