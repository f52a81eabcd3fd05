package backendtest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// ChargeLoad is a gateway's traffic on one tenant's token limit: Clients
// callers, each checking (zero hits) before it forwards a request,
// waiting Think while the model answers, then charging Tokens, the
// tokens the response used, as the gateway does when the stream ends.
// A caller denied at its check waits Backoff and checks again.
type ChargeLoad struct {
	Clients int
	Tokens  uint64
	Think   time.Duration
	Backoff time.Duration
	Run     time.Duration
	// Deadline is each call's, as Envoy's filter timeout (0: 1 s).
	Deadline time.Duration
}

// ChargeRunEnv names the environment variable that sets how long the
// charge storms of the backends' TestChargesHoldTheBound run (a Go
// duration; 3 s unless set): `make bench-charges` runs them for 20 s.
const ChargeRunEnv = "SLUICE_CHARGE_RUN"

// ChargeDelayEnv names the environment variable that sets how far the
// stores of the backends' TestChargesHoldTheBound are from their
// replicas (a Go duration; 5 ms unless set): 70ms puts them in another
// region.
const ChargeDelayEnv = "SLUICE_CHARGE_DELAY"

// ChargeRun is how long a charge storm runs: ChargeRunEnv's duration, or
// 3 s. A value that is not a positive duration fails t.
func ChargeRun(t testing.TB) time.Duration {
	t.Helper()
	return envDuration(t, ChargeRunEnv, 3*time.Second)
}

// ChargeDelay is how far a charge storm's store is: ChargeDelayEnv's
// duration, or 5 ms. A value that is not a positive duration fails t.
func ChargeDelay(t testing.TB) time.Duration {
	t.Helper()
	return envDuration(t, ChargeDelayEnv, 5*time.Millisecond)
}

func envDuration(t testing.TB, name string, unset time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return unset
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive Go duration such as 20s", name, v)
	}
	return d
}

// ChargeResult is what a ChargeLoad did.
type ChargeResult struct {
	Admitted int64         // checks that passed: requests forwarded
	Denied   int64         // checks denied
	Failed   int64         // checks or charges that failed
	Charged  int64         // charges answered, every one of Tokens
	Elapsed  time.Duration // from the first check to the last charge's answer
	// FirstErr is the first failed call's error, with whether it was a
	// check or a charge and how long it took; "" for none.
	FirstErr string
}

// Used is the tokens the admitted requests used.
func (r ChargeResult) Used(l ChargeLoad) int64 { return r.Admitted * int64(l.Tokens) }

func (r ChargeResult) String() string {
	s := fmt.Sprintf("%d admitted, %d denied, %d failed, %d charged in %v",
		r.Admitted, r.Denied, r.Failed, r.Charged, r.Elapsed.Round(time.Millisecond))
	if r.FirstErr != "" {
		s += " (first failure: " + r.FirstErr + ")"
	}
	return s
}

// Bound is what the load's admitted requests may use at most on limit l
// over the run: B + R*T, and each request in flight at any moment can
// overshoot by its own tokens, no more (Clients of them).
func (r ChargeResult) Bound(l bucket.Limit, load ChargeLoad) (bound, reachable float64) {
	reachable = float64(l.Burst)/bucket.Milli + float64(l.Amount)/bucket.Milli*r.Elapsed.Seconds()*1000/float64(l.Period)
	return reachable + float64(load.Clients)*float64(load.Tokens), reachable
}

// ChargeStorm runs load on req's bucket over ds, each caller on the
// replica of its number (ds[i%len(ds)]).
func ChargeStorm(ds []Decider, req backend.Request, load ChargeLoad) ChargeResult {
	deadline := load.Deadline
	if deadline <= 0 {
		deadline = time.Second
	}
	var admitted, denied, failed, charged atomic.Int64
	var firstErr sync.Once
	var first string
	fail := func(what string, took time.Duration, err error) {
		failed.Add(1)
		firstErr.Do(func() { first = fmt.Sprintf("%s after %v: %v", what, took.Round(time.Millisecond), err) })
	}
	start := time.Now()
	stop := start.Add(load.Run)
	var wg sync.WaitGroup
	for i := range load.Clients {
		d := ds[i%len(ds)]
		wg.Go(func() {
			for time.Now().Before(stop) {
				check := req
				check.Hits, check.Charge = 0, false
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				began := time.Now()
				dec, err := d.Decide(ctx, &check)
				cancel()
				switch {
				case err != nil:
					fail("check", time.Since(began), err)
					time.Sleep(load.Backoff)
					continue
				case !dec.Allowed:
					denied.Add(1)
					time.Sleep(load.Backoff)
					continue
				}
				admitted.Add(1)
				time.Sleep(load.Think)
				charge := req
				charge.Hits, charge.Charge = load.Tokens, true
				// A charge is not bound by Envoy's deadline (ratelimit
				// gives it a deadline of its own).
				ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
				began = time.Now()
				_, err = d.Decide(ctx, &charge)
				cancel()
				if err != nil {
					fail("charge", time.Since(began), err)
				} else {
					charged.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return ChargeResult{Admitted: admitted.Load(), Denied: denied.Load(), Failed: failed.Load(),
		Charged: charged.Load(), Elapsed: time.Since(start), FirstErr: first}
}

// HoldsTheBound fails t unless what r's admitted requests used on l lies
// within [0.8, 1] of Bound, with its overshoot: the bound held by
// counting every charge, and not by refusing what the limit had.
func (r ChargeResult) HoldsTheBound(t testing.TB, l bucket.Limit, load ChargeLoad) {
	t.Helper()
	bound, reachable := r.Bound(l, load)
	used := float64(r.Used(load))
	t.Logf("%s: %.0f tokens used by admitted requests; B + R*T = %.0f (%.3f of it), bound with %d in flight %.0f",
		r, used, reachable, used/reachable, load.Clients, bound)
	if used > bound {
		t.Errorf("admitted requests used %.0f tokens, over B + R*T + K*N = %.0f", used, bound)
	}
	if used < 0.8*reachable {
		t.Errorf("admitted requests used %.0f tokens, below 0.8 of B + R*T = %.0f", used, reachable)
	}
	if r.Failed > 0 {
		t.Errorf("%d checks or charges failed", r.Failed)
	}
}

// Counted fails t unless consumed, a bucket's total consumed as its store
// keeps it (millitokens), holds every charge r's callers were answered
// for: a charge answered and not written would be tokens used without
// a trace. Leases count what they take when they take it, so consumed
// may be more.
func (r ChargeResult) Counted(t testing.TB, consumed int64, load ChargeLoad) {
	t.Helper()
	if want := r.Charged * int64(load.Tokens) * bucket.Milli; consumed < want {
		t.Errorf("the bucket counts %d millitokens consumed, fewer than the %d charges answered (%d)", consumed, r.Charged, want)
	}
}

// RegionalChargeStorm is ChargeStorm on a global limit l over ds, the
// replicas of one region, each deciding under g: a global limit's
// charges land in the region's part of it, so the region's part (its
// burst, rate and debt floor as g scales them) must hold the bound with
// debt (HoldsTheBound). The tenant is region-tenant/chat.
func RegionalChargeStorm(t *testing.T, ds []Decider, g backend.Global, l bucket.Limit, load ChargeLoad) ChargeResult {
	t.Helper()
	part := g.Apply(true, backend.Resolved{Limits: []bucket.Limit{l}}).Limits[0]
	t.Logf("the region's part of %d/%d ms: %d/%d ms, burst %d, debt %d (millitokens)", l.Amount, l.Period, part.Amount, part.Period, part.Burst, part.Debt)
	r := ChargeStorm(ds, backend.Request{Entity: "region-tenant", Resource: "chat", Defaults: []bucket.Limit{l}, Global: true}, load)
	r.HoldsTheBound(t, part, load)
	return r
}

// ChargeSpanAfterIdle holds the bound with debt over a span that starts
// after idle: each of ds checks and charges a few requests (their
// leases are taken), the bucket then sits idle until it has refilled to
// its burst, and a storm of load (ChargeStorm) follows. The tokens its
// admitted requests use, counted from its first check, must stay within
// B + R*T + K*N: leases taken before the span are part of the burst the
// span starts from, not spent on top of it. l is the tenant's limit;
// its debt must hold K*N.
func ChargeSpanAfterIdle(t *testing.T, ds []Decider, l bucket.Limit, load ChargeLoad) ChargeResult {
	t.Helper()
	req := backend.Request{Entity: "idle-tenant", Resource: "chat", Defaults: []bucket.Limit{l}}
	for i := range 3 * len(ds) {
		d := ds[i%len(ds)]
		check, charge := req, req
		charge.Hits, charge.Charge = load.Tokens, true
		for _, r := range []*backend.Request{&check, &charge} {
			if dec, err := d.Decide(context.Background(), r); err != nil || !dec.Allowed {
				t.Fatalf("warm-up call %d (charge %v): %+v, %v", i, r.Charge, dec, err)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Long enough for the bucket to refill to its burst twice over.
	time.Sleep(time.Duration(2*l.Burst*l.Period/max(l.Amount, 1)) * time.Millisecond)
	r := ChargeStorm(ds, req, load)
	r.HoldsTheBound(t, l, load)
	return r
}

// FloodAtARequestLimit holds the other half of the debt rule: plain
// requests (hits of their own, never charges) at three times a request
// limit of 100 a second with a burst of 100, paced over ds for 3 s from
// a fresh bucket, are admitted within [0.9, 1.0] of B + R*T + 1. A
// denied request takes nothing, so a flood at an exhausted limit is
// never locked out beyond its rate, while debt stays open to the
// charges that other limits of the same rule file take (the limit's
// default debt of one burst is in force).
func FloodAtARequestLimit(t *testing.T, ds []Decider, l bucket.Limit) {
	t.Helper()
	if l.Amount != 100*bucket.Milli || l.Period != bucket.Second || l.Burst != 100*bucket.Milli {
		t.Fatalf("FloodAtARequestLimit wants a limit of 100/s with a burst of 100, got %+v", l)
	}
	req := backend.Request{Entity: "flood", Resource: "api", Defaults: []bucket.Limit{l}, Hits: 1}
	// A second of the same flood on another key first: a store's first
	// seconds (a JVM compiling, connections opening) are no part of the
	// rule under test.
	warm := req
	warm.Entity = "flood-warm"
	t.Logf("the warm-up flood: %v", Paced(ds, warm, 300, time.Second, time.Second))
	start := time.Now()
	r := Paced(ds, req, 300, 3*time.Second, time.Second)
	elapsed := time.Since(start)
	bound := 100 + 100*elapsed.Seconds() + 1
	t.Logf("%v; B + R*T + 1 = %.0f over %v (%.3f of it)", r, bound, elapsed.Round(time.Millisecond), float64(r.Admitted)/bound)
	if float64(r.Admitted) > bound {
		t.Errorf("admitted %d, over B + R*T + 1 = %.0f", r.Admitted, bound)
	}
	if float64(r.Admitted) < 0.9*bound {
		t.Errorf("admitted %d, below 0.9 of B + R*T + 1 = %.0f", r.Admitted, bound)
	}
	if r.Failed > 0 {
		t.Errorf("%d calls failed (first: %s)", r.Failed, r.FirstErr)
	}
}
