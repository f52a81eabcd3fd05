package dynamodb

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/backendtest"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/regions"
)

// Charges after the response land beyond what is left, into debt, on
// DynamoDB Local (backendtest.ChargesLandInDebt): one conditional write
// each without leases, and with leases, where a lease that cannot pay a
// charge sends it to the table, whose write takes the rest of the limit
// below zero.
func TestChargesLandInDebt(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		name string
		opts Options
	}{
		{"without leases", Options{KeyPrefix: "nolease", LeaseHorizon: -1}},
		{"with leases", Options{KeyPrefix: "lease"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			backendtest.ChargesLandInDebt(t, e.replica(t, c.opts), e.admin(t, c.opts.KeyPrefix).GetBucket)
		})
	}
}

// Twenty gateway callers over three replicas 5 ms from the table
// (backendtest.ChargeDelayEnv sets another distance) each
// check, wait while the model answers and charge 100 tokens: what the
// admitted requests use stays within B + R*T and the requests in
// flight (backendtest.ChargeStorm), with leases on, and the table counts
// every charge. Before a charge that did not fit was kept in its batch's
// write, half the charges were answered and never written (80 admitted
// where 60 could be, 4,000 consumed for 8,000 charged).
func TestChargesHoldTheBound(t *testing.T) {
	e := newEnv(t)
	ds := replicasAt(t, e, Options{KeyPrefix: "storm"}, backendtest.ChargeDelay(t))
	l := lim(t, "tpm", "1000/s", 1000)
	l.Debt = 3000 * bucket.Milli
	load := backendtest.ChargeLoad{Clients: 20, Tokens: 100, Think: 50 * time.Millisecond, Backoff: 5 * time.Millisecond, Run: backendtest.ChargeRun(t)}
	r := backendtest.ChargeStorm(ds, backend.Request{Entity: "tenant", Resource: "chat", Defaults: []bucket.Limit{l}}, load)
	r.HoldsTheBound(t, l, load)
	var writes uint64
	for _, d := range ds {
		writes += writeCalls(d.(*Backend))
	}
	t.Logf("%d store writes, %.2f per admitted request", writes, float64(writes)/float64(max(r.Admitted, 1)))
	bk, ok, err := e.admin(t, "storm").GetBucket(t.Context(), "tenant", "chat")
	if err != nil || !ok {
		t.Fatalf("reading the bucket: found %v, %v", ok, err)
	}
	r.Counted(t, bk.States[0].Consumed, load)
}

// A global limit's charges land in the region's part of it, into debt
// there (backendtest.RegionalChargeStorm): three replicas in eu-west-1,
// weighted 1 to us-east-1's 3, 5 ms from the region's table
// (backendtest.ChargeDelayEnv sets another distance), hold the bound
// with debt on their quarter of the tenant's 4,000 tokens a second, and
// the table counts every charge.
func TestChargesHoldTheBoundInARegion(t *testing.T) {
	e := newEnv(t)
	g := backendtest.FixedGlobal(t, map[regions.Region]int64{"us-east-1": 3, "eu-west-1": 1}, "eu-west-1")
	ds := replicasAt(t, e, Options{KeyPrefix: "region-storm", Global: g}, backendtest.ChargeDelay(t))
	l := lim(t, "tpm", "4000/s", 4000)
	l.Debt = 12000 * bucket.Milli
	load := backendtest.ChargeLoad{Clients: 20, Tokens: 100, Think: 50 * time.Millisecond, Backoff: 5 * time.Millisecond, Run: backendtest.ChargeRun(t)}
	r := backendtest.RegionalChargeStorm(t, ds, g, l, load)
	bk, ok, err := e.admin(t, "region-storm").GetBucket(t.Context(), "region-tenant", "chat")
	if err != nil || !ok {
		t.Fatalf("reading the bucket: found %v, %v", ok, err)
	}
	r.Counted(t, bk.States[0].Consumed, load)
}

// The bound with debt holds over a span that starts after idle, with the
// leases of the tenant's first requests out (backendtest.ChargeSpanAfterIdle):
// three replicas 5 ms from the table.
func TestChargeSpanAfterIdle(t *testing.T) {
	e := newEnv(t)
	ds := nearReplicas(t, e, "idle")
	l := lim(t, "tpm", "1000/s", 1000)
	l.Debt = 3000 * bucket.Milli
	backendtest.ChargeSpanAfterIdle(t, ds, l, backendtest.ChargeLoad{Clients: 6, Tokens: 100, Think: 50 * time.Millisecond, Backoff: 5 * time.Millisecond, Run: 2 * time.Second})
}

// sluice buckets reset on DynamoDB Local (backendtest.ResetsBuckets).
func TestResetBucket(t *testing.T) {
	e := newEnv(t)
	backendtest.ResetsBuckets(t, e.replica(t, Options{KeyPrefix: "reset", LeaseHorizon: -1}), e.admin(t, "reset").ResetBucket)
}

// A charge on a warm lease costs no more writes than an admission: one
// replica, leases on; a request's tokens charged after it are paid from
// the lease as the request itself would be (backendtest.ChargesOnAWarmLease).
func TestChargeOnAWarmLeaseCostsWhatAnAdmissionDoes(t *testing.T) {
	e := newEnv(t)
	now := func() int64 { return time.Now().UnixMilli() }
	backendtest.ChargesOnAWarmLease(t,
		func() backendtest.Decider { return e.replica(t, Options{Now: now, KeyPrefix: "cost"}) },
		func(d backendtest.Decider) uint64 { return writeCalls(d.(*Backend)) })
}

// A flood of plain requests at three times a request limit is admitted
// at the limit's rate, as before debt (backendtest.FloodAtARequestLimit).
func TestFloodAtARequestLimit(t *testing.T) {
	e := newEnv(t)
	ds := nearReplicas(t, e, "flood")
	backendtest.FloodAtARequestLimit(t, ds, lim(t, "rpm", "100/s", 100))
}

// nearReplicas are three replicas 5 ms from e's table, on the wall
// clock, with keys under prefix.
func nearReplicas(t *testing.T, e *env, prefix string) []backendtest.Decider {
	t.Helper()
	return replicasAt(t, e, Options{KeyPrefix: prefix}, 5*time.Millisecond)
}

// replicasAt is three replicas of opts on the wall clock whose writes
// take delay.
func replicasAt(t *testing.T, e *env, opts Options, delay time.Duration) []backendtest.Decider {
	t.Helper()
	opts.Now = func() int64 { return time.Now().UnixMilli() }
	var ds []backendtest.Decider
	for range 3 {
		ds = append(ds, e.replica(t, opts, slowWrites{e.client, delay}))
	}
	return ds
}

// A tenant charged into debt on one replica is denied on the others
// (backendtest.DebtSeenByEveryReplica): three replicas 5 ms from the
// table, each holding a lease.
func TestDebtSeenByEveryReplica(t *testing.T) {
	e := newEnv(t)
	backendtest.DebtSeenByEveryReplica(t, nearReplicas(t, e, "spread"), 3*time.Second, e.admin(t, "spread").GetBucket)
}

// A charge planned on a view of a bucket at its limit that another
// replica has written since lands in one write: charges alone claim no
// refill (they need none to land), so another replica's admission,
// which claims refill and moves the clock, does not fail their
// condition. When a charge claimed the refill too, it lost its race to
// every such write: on a busy machine, charges took 11 writes and 2 s,
// past their deadline, on a bucket three replicas took from.
func TestChargeOnAStaleViewLandsInOneWrite(t *testing.T) {
	e := newEnv(t)
	opts := Options{KeyPrefix: "stale", LeaseHorizon: -1}
	a, b := e.replica(t, opts), e.replica(t, opts)
	l := lim(t, "tpm", "1000/s", 1000)
	req := func(hits uint64, charge bool) *backend.Request {
		return &backend.Request{Entity: "tenant", Resource: "chat", Defaults: []bucket.Limit{l}, Hits: hits, Charge: charge}
	}
	decide := func(who string, d *Backend, r *backend.Request) backend.Decision {
		t.Helper()
		dec, err := d.Decide(t.Context(), r)
		if err != nil {
			t.Fatalf("%s: %v", who, err)
		}
		return dec
	}
	// b empties the bucket and sees it at zero; 100 ms of refill pend.
	decide("b's charge of the whole burst", b, req(1000, true))
	e.clock.advance(100)
	// a admits from the refill: its write moves the clock b saw.
	if dec := decide("a's admission", a, req(10, false)); !dec.Allowed {
		t.Fatalf("a's admission of 10 with 100 ms of refill pending: %+v", dec)
	}
	writes, retries := writeCalls(b), b.Stats().ConditionRetries.Load()
	decide("b's charge on its old view", b, req(300, true))
	if w, r := writeCalls(b)-writes, b.Stats().ConditionRetries.Load()-retries; w != 1 || r != 0 {
		t.Errorf("b's charge took %d writes and lost %d races, want 1 write and none", w, r)
	}
	bk, ok, err := e.admin(t, "stale").GetBucket(t.Context(), "tenant", "chat")
	if err != nil || !ok {
		t.Fatalf("reading the bucket: found %v, %v", ok, err)
	}
	if got, want := bk.States[0].Consumed, int64(1310)*bucket.Milli; got != want {
		t.Errorf("consumed %d millitokens, want %d (every charge and admission)", got, want)
	}
	// 1,000 + 10 + 300 taken, 100 refilled: the bucket holds -210.
	got := bucket.Refill(l, bk.States[0], e.clock.now())
	if want := int64(-210) * bucket.Milli; got.Tokens != want {
		t.Errorf("the bucket holds %d millitokens at now, want %d", got.Tokens, want)
	}
}
