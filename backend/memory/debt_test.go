package memory

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/backendtest"
	"github.com/sluice-rl/sluice/backend/bucket"
)

func TestChargesLandInDebt(t *testing.T) {
	b, _ := newTestBackend(t, Options{})
	backendtest.ChargesLandInDebt(t, b, nil)
}

// Twenty gateway callers each check, wait while the model answers and
// charge 100 tokens, far more than the limit's rate: what the admitted
// requests use stays within B + R*T and the requests in flight, on a
// limit whose debt can hold what those in flight use (with the default
// of one burst, 1,000 here, the floor forgave up to 1,000 of the 2,000
// they could use, and 69 requests were admitted where 60 could be).
func TestChargesHoldTheBound(t *testing.T) {
	b := New(Options{SweepInterval: -1})
	t.Cleanup(func() { b.Close() })
	l := limit(t, "tpm=1000/s:1000")
	l.Debt = 2000 * bucket.Milli
	load := backendtest.ChargeLoad{Clients: 20, Tokens: 100, Think: 50 * time.Millisecond, Backoff: 5 * time.Millisecond, Run: backendtest.ChargeRun(t)}
	r := backendtest.ChargeStorm([]backendtest.Decider{b}, backend.Request{Entity: "tenant", Resource: "chat", Defaults: []bucket.Limit{l}}, load)
	r.HoldsTheBound(t, l, load)
	snap, ok := b.Snapshot("tenant", "chat")
	if !ok {
		t.Fatal("the tenant's bucket is gone")
	}
	r.Counted(t, snap.States[0].Consumed, load)
}

// The storm of TestChargesHoldTheBound on a global limit four times as
// large, on a replica in eu-west-1 whose part is a quarter of it
// (backendtest.RegionalChargeStorm): the bound with debt holds on the
// region's part.
func TestChargesHoldTheBoundInARegion(t *testing.T) {
	g := euWestQuarter(t)
	b := New(Options{SweepInterval: -1, Global: g})
	t.Cleanup(func() { b.Close() })
	l := limit(t, "tpm=4000/s:4000")
	l.Debt = 8000 * bucket.Milli
	load := backendtest.ChargeLoad{Clients: 20, Tokens: 100, Think: 50 * time.Millisecond, Backoff: 5 * time.Millisecond, Run: backendtest.ChargeRun(t)}
	r := backendtest.RegionalChargeStorm(t, []backendtest.Decider{b}, g, l, load)
	snap, ok := b.Snapshot("region-tenant", "chat")
	if !ok {
		t.Fatal("the tenant's bucket is gone")
	}
	r.Counted(t, snap.States[0].Consumed, load)
}

// A global limit's charges land in their region's part of it: eu-west-1,
// a quarter of 400 a second (100, and a burst of 100), charged 250 tokens
// goes a burst into debt there (its floor is its part's burst), and
// denies even a check; the limit's other regions are not this replica's
// to charge.
func TestChargesLandInTheRegionsShare(t *testing.T) {
	b, _ := newTestBackend(t, Options{Global: euWestQuarter(t)})
	l := []bucket.Limit{limit(t, "tpm=400/s")}
	d := decide(t, b, backend.Request{Entity: "t", Resource: "chat", Defaults: l, Hits: 250, Global: true, Charge: true})
	if d.Allowed || d.Results[0].Tokens != -100*bucket.Milli || d.Limits[0].Burst != 100*bucket.Milli {
		t.Fatalf("a charge of 250 on eu-west-1's 100: allowed %v, %d millitokens left of a burst of %d; want denied at -100000 of 100000",
			d.Allowed, d.Results[0].Tokens, d.Limits[0].Burst)
	}
	if d := decide(t, b, backend.Request{Entity: "t", Resource: "chat", Defaults: l, Hits: 0, Global: true}); d.Allowed {
		t.Error("a check was admitted in the region's debt")
	}
}

// A flood of plain requests at three times a request limit is admitted
// at the limit's rate, as before debt (backendtest.FloodAtARequestLimit).
func TestFloodAtARequestLimit(t *testing.T) {
	b := New(Options{SweepInterval: -1})
	t.Cleanup(func() { b.Close() })
	backendtest.FloodAtARequestLimit(t, []backendtest.Decider{b}, limit(t, "rpm=100/s:100"))
}
