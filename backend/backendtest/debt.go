package backendtest

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// ChargesLandInDebt holds a backend to what a gateway that charges after
// the response relies on, on one bucket of 60 a minute (a token a
// second, so the test's own seconds barely refill it) with the default
// debt of one burst: a charge beyond what is left still lands, the
// limit goes below zero and denies checks and admissions (taking
// nothing for them) with a wait until it is above zero again, a refund
// repays the debt, and a charge of absurd hits stops at the floor.
// stored, when not nil, reads the bucket as its store keeps it (an
// Admin's GetBucket): it must hold the debt, count every charge as
// consumed, and break none of the invariants an audit checks.
func ChargesLandInDebt(t *testing.T, d Decider, stored func(ctx context.Context, entity, resource string) (backend.Bucket, bool, error)) {
	t.Helper()
	l := bucket.Limit{Name: "tpm", Amount: 60 * bucket.Milli, Period: bucket.Minute, Burst: 60 * bucket.Milli}
	call := func(what string, hits uint64, charge, refund bool) backend.Decision {
		t.Helper()
		dec, err := d.Decide(context.Background(), &backend.Request{Entity: "tenant", Resource: "chat",
			Defaults: []bucket.Limit{l}, Hits: hits, Charge: charge, Refund: refund})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(dec.Results) != 1 {
			t.Fatalf("%s: %d results, want 1", what, len(dec.Results))
		}
		return dec
	}
	// tokens reports what a decision left, in whole tokens, rounded
	// down: refill adds a little between calls.
	tokens := func(dec backend.Decision) int64 {
		return int64(math.Floor(float64(dec.Results[0].Tokens) / bucket.Milli))
	}
	near := func(what string, dec backend.Decision, want int64) {
		t.Helper()
		// A token a second: allow the test's own time between calls.
		if got := tokens(dec); got < want || got > want+5 {
			t.Fatalf("%s: %d tokens left, want %d (up to 5 more for refill)", what, got, want)
		}
	}

	if dec := call("a check on a new bucket", 0, false, false); !dec.Allowed {
		t.Fatal("a check on a new bucket was denied")
	}
	dec := call("a charge of 50", 50, true, false)
	if !dec.Allowed {
		t.Fatal("a charge of 50 on a full bucket of 60 reported that it did not fit")
	}
	near("a charge of 50", dec, 10)
	dec = call("a second charge of 50", 50, true, false)
	if dec.Allowed {
		t.Fatal("a charge of 50 with about 10 left reported that it fitted")
	}
	near("a second charge of 50 (into debt)", dec, -40)
	if w := dec.Results[0].Wait; w < 30*bucket.Second || w > 41*bucket.Second {
		t.Fatalf("a charge that left about 40 tokens of debt waits %d ms, want the time until above zero (about 40 s)", w)
	}
	for _, hits := range []uint64{0, 1} {
		dec = call("a call in debt", hits, false, false)
		if dec.Allowed {
			t.Fatalf("a call of %d hits was admitted while the bucket was in debt", hits)
		}
		near("a call denied in debt (it takes nothing)", dec, -40)
		if w := dec.Results[0].Wait; w < 30*bucket.Second || w > 41*bucket.Second {
			t.Fatalf("a call of %d hits denied in debt waits %d ms, want the time until above zero (about 40 s)", hits, w)
		}
	}
	dec = call("a refund of 45", 45, false, true)
	near("a refund of 45 on a debt of 40", dec, 5)
	if dec = call("a check after the refund", 0, false, false); !dec.Allowed {
		t.Fatal("a check was denied after a refund repaid the debt")
	}
	dec = call("a charge of 2^64-1 hits", math.MaxUint64, true, false)
	near("a charge of 2^64-1 hits (to the floor, one burst of debt)", dec, -60)
	// Whatever a lease held went into the charge: nothing is left to
	// admit even a check.
	if dec = call("a check at the floor", 0, false, false); dec.Allowed {
		t.Fatalf("a check was admitted at the floor (%d millitokens)", dec.Results[0].Tokens)
	}
	dec = call("a charge at the floor", 10, true, false)
	near("a charge at the floor (stays there)", dec, -60)
	if stored == nil {
		return
	}
	b, ok, err := stored(context.Background(), "tenant", "chat")
	if err != nil || !ok {
		t.Fatalf("reading the stored bucket: found %v, %v", ok, err)
	}
	if len(b.States) != 1 {
		t.Fatalf("the stored bucket has %d limits, want 1", len(b.States))
	}
	s := b.States[0]
	// What the store holds may be short of what the answers said by
	// the tokens a lease holds; the lease took them from the bucket.
	if s.Tokens > -55*bucket.Milli || s.Tokens < -60*bucket.Milli {
		t.Errorf("the stored bucket holds %d millitokens, want about -60000 (one burst of debt)", s.Tokens)
	}
	// Leases count what they take as consumed when they take it: a
	// charge a lease paid shows there.
	if want := 100*bucket.Milli + bucket.Cost(l, math.MaxUint64); s.Consumed < want {
		t.Errorf("the stored bucket counts %d millitokens consumed, want at least every charge: %d", s.Consumed, want)
	}
	if v := b.Violations(time.Now().UnixMilli(), time.Second); len(v) > 0 {
		t.Errorf("the stored bucket breaks invariants: %v", v)
	}
}

// ChargesOnAWarmLease holds a charge on a warm lease to what an admission
// costs the store: on a tenant's bucket of 10,000 tokens a second, 200
// admissions of 20 hits on one replica, then 200 check-then-charge pairs
// of 20 tokens on another tenant and a second replica, each after 20
// warm-up admissions, 2 ms apart, must make as many store writes, give or
// take two (a renewal that falls either side of the run's end). replica
// returns a new replica with leases on; writes reads how many store
// writes it has made.
func ChargesOnAWarmLease(t *testing.T, replica func() Decider, writes func(Decider) uint64) {
	t.Helper()
	l := bucket.Limit{Name: "tpm", Amount: 10_000 * bucket.Milli, Period: bucket.Second, Burst: 10_000 * bucket.Milli}
	decide := func(d Decider, r backend.Request) {
		t.Helper()
		if _, err := d.Decide(context.Background(), &r); err != nil {
			t.Fatal(err)
		}
	}
	run := func(entity string, charge bool) uint64 {
		d := replica()
		req := backend.Request{Entity: entity, Resource: "chat", Defaults: []bucket.Limit{l}, Hits: 20}
		for range 20 {
			decide(d, req)
			time.Sleep(2 * time.Millisecond)
		}
		before := writes(d)
		for range 200 {
			if charge {
				check, used := req, req
				check.Hits, used.Charge = 0, true
				decide(d, check)
				decide(d, used)
			} else {
				decide(d, req)
			}
			time.Sleep(2 * time.Millisecond)
		}
		return writes(d) - before
	}
	admissions, charges := run("admits", false), run("charges", true)
	t.Logf("store writes for 200 requests on a warm lease: %d admitting, %d checking then charging", admissions, charges)
	if charges > admissions+2 {
		t.Errorf("charges on a warm lease made %d store writes where admissions made %d", charges, admissions)
	}
}
