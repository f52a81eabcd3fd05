package redis

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/backendtest"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
	"github.com/sluice-rl/sluice/regions"
)

// Charges after the response land beyond what is left, into debt, on a
// real Redis (backendtest.ChargesLandInDebt): decided by the script
// alone, and with leases, where a lease that cannot pay a charge sends
// it whole to the shared bucket.
func TestChargesLandInDebt(t *testing.T) {
	srv := redistest.Require(t)
	for _, c := range []struct {
		name string
		opts Options
	}{
		{"without leases", Options{KeyPrefix: "nolease", LeaseHorizon: -1}},
		{"with leases", Options{KeyPrefix: "lease", LeaseHorizon: 30 * time.Second}},
	} {
		t.Run(c.name, func(t *testing.T) {
			client := newClient(t, srv)
			backendtest.ChargesLandInDebt(t, newBackend(t, client, c.opts), newAdmin(t, client, c.opts.KeyPrefix, nil).GetBucket)
		})
	}
}

// Twenty gateway callers over three replicas 5 ms from Redis (or
// backendtest.ChargeDelayEnv's distance) each check,
// wait while the model answers and charge 100 tokens: what the admitted
// requests use stays within B + R*T and the requests in flight
// (backendtest.ChargeStorm), with leases on, and Redis counts every
// charge. A charge a lease could not pay whole takes what the lease held
// (Leases.Charging): sent whole to Redis, it left the lease to pass checks
// while the bucket was in debt (80 admitted where 60 could be).
func TestChargesHoldTheBound(t *testing.T) {
	srv := redistest.Require(t)
	client := newClient(t, srv)
	ds := replicasAt(t, srv, Options{KeyPrefix: "storm"}, backendtest.ChargeDelay(t))
	l := bucket.Limit{Name: "tpm", Amount: 1000 * bucket.Milli, Period: bucket.Second, Burst: 1000 * bucket.Milli, Debt: 3000 * bucket.Milli}
	load := backendtest.ChargeLoad{Clients: 20, Tokens: 100, Think: 50 * time.Millisecond, Backoff: 5 * time.Millisecond, Run: backendtest.ChargeRun(t)}
	r := backendtest.ChargeStorm(ds, backend.Request{Entity: "tenant", Resource: "chat", Defaults: []bucket.Limit{l}}, load)
	r.HoldsTheBound(t, l, load)
	bk, ok, err := newAdmin(t, client, "storm", nil).GetBucket(t.Context(), "tenant", "chat")
	if err != nil || !ok {
		t.Fatalf("reading the bucket: found %v, %v", ok, err)
	}
	r.Counted(t, bk.States[0].Consumed, load)
}

// A global limit's charges land in the region's part of it, into debt
// there (backendtest.RegionalChargeStorm): three replicas in eu-west-1,
// weighted 1 to us-east-1's 3, on the region's Redis 5 ms away
// (backendtest.ChargeDelayEnv sets another distance), hold the bound
// with debt on their quarter of the tenant's 4,000 tokens a second, and
// Redis counts every charge.
func TestChargesHoldTheBoundInARegion(t *testing.T) {
	srv := redistest.Require(t)
	client := newClient(t, srv)
	g := backendtest.FixedGlobal(t, map[regions.Region]int64{"us-east-1": 3, "eu-west-1": 1}, "eu-west-1")
	ds := replicasAt(t, srv, Options{KeyPrefix: "region-storm", Global: g}, backendtest.ChargeDelay(t))
	l := bucket.Limit{Name: "tpm", Amount: 4000 * bucket.Milli, Period: bucket.Second, Burst: 4000 * bucket.Milli, Debt: 12000 * bucket.Milli}
	load := backendtest.ChargeLoad{Clients: 20, Tokens: 100, Think: 50 * time.Millisecond, Backoff: 5 * time.Millisecond, Run: backendtest.ChargeRun(t)}
	r := backendtest.RegionalChargeStorm(t, ds, g, l, load)
	bk, ok, err := newAdmin(t, client, "region-storm", nil).GetBucket(t.Context(), "region-tenant", "chat")
	if err != nil || !ok {
		t.Fatalf("reading the bucket: found %v, %v", ok, err)
	}
	r.Counted(t, bk.States[0].Consumed, load)
}

// The bound with debt holds over a span that starts after idle, with the
// leases of the tenant's first requests out (backendtest.ChargeSpanAfterIdle):
// three replicas 5 ms from Redis.
func TestChargeSpanAfterIdle(t *testing.T) {
	srv := redistest.Require(t)
	ds := nearReplicas(t, srv, "idle")
	l := bucket.Limit{Name: "tpm", Amount: 1000 * bucket.Milli, Period: bucket.Second, Burst: 1000 * bucket.Milli, Debt: 3000 * bucket.Milli}
	backendtest.ChargeSpanAfterIdle(t, ds, l, backendtest.ChargeLoad{Clients: 6, Tokens: 100, Think: 50 * time.Millisecond, Backoff: 5 * time.Millisecond, Run: 2 * time.Second})
}

// sluice buckets reset on a real Redis (backendtest.ResetsBuckets).
func TestResetBucket(t *testing.T) {
	srv := redistest.Require(t)
	client := newClient(t, srv)
	backendtest.ResetsBuckets(t, newBackend(t, client, Options{KeyPrefix: "reset", LeaseHorizon: -1}), newAdmin(t, client, "reset", nil).ResetBucket)
}

// A flood of plain requests at three times a request limit is admitted
// at the limit's rate, as before debt (backendtest.FloodAtARequestLimit).
func TestFloodAtARequestLimit(t *testing.T) {
	srv := redistest.Require(t)
	ds := nearReplicas(t, srv, "flood")
	backendtest.FloodAtARequestLimit(t, ds, bucket.Limit{Name: "rpm", Amount: 100 * bucket.Milli, Period: bucket.Second, Burst: 100 * bucket.Milli})
}

// nearReplicas are three replicas 5 ms from srv, leases on, with keys
// under prefix.
func nearReplicas(t *testing.T, srv *redistest.Server, prefix string) []backendtest.Decider {
	t.Helper()
	return replicasAt(t, srv, Options{KeyPrefix: prefix}, 5*time.Millisecond)
}

// replicasAt is three replicas of opts, with leases, each of whose
// calls takes delay more.
func replicasAt(t *testing.T, srv *redistest.Server, opts Options, delay time.Duration) []backendtest.Decider {
	t.Helper()
	opts.LeaseHorizon, opts.Call = 30*time.Second, farCall(delay)
	var ds []backendtest.Decider
	for range 3 {
		ds = append(ds, newBackend(t, newClient(t, srv), opts))
	}
	return ds
}

// A tenant charged into debt on one replica is denied on the others
// (backendtest.DebtSeenByEveryReplica): three replicas 5 ms from Redis,
// each holding a lease.
func TestDebtSeenByEveryReplica(t *testing.T) {
	srv := redistest.Require(t)
	backendtest.DebtSeenByEveryReplica(t, nearReplicas(t, srv, "spread"), 3*time.Second, newAdmin(t, newClient(t, srv), "spread", nil).GetBucket)
}

// A charge on a warm lease costs no more script runs than an admission
// (backendtest.ChargesOnAWarmLease): one replica 5 ms from Redis, leases on.
func TestChargeOnAWarmLeaseCostsWhatAnAdmissionDoes(t *testing.T) {
	srv := redistest.Require(t)
	backendtest.ChargesOnAWarmLease(t,
		func() backendtest.Decider {
			return newBackend(t, newClient(t, srv), Options{KeyPrefix: "cost", LeaseHorizon: 30 * time.Second, Call: farCall(5 * time.Millisecond)})
		},
		func(d backendtest.Decider) uint64 { return d.(*Backend).Stats().Scripts.Load() })
}
