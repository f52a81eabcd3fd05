package backendtest

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// DebtSeenByEveryReplica holds what a gateway spread over replicas
// relies on: a tenant whose response charged its token limit deep into
// debt on one replica is held back on all of them. ds are three replicas
// of one store, with leases. Each first takes the gateways' pattern a
// few times (a check, then a charge of what the response used), so that
// each holds a lease; then ds[0] charges three bursts' worth of tokens.
// The store must hold the debt in the shared bucket. ds[1] then sees
// only checks of zero hits, which spend nothing from its lease, and ds[2]
// checks and admissions: both must deny within seen, answering nothing
// left, having admitted on the way at most what the store counts out on
// lease (tokens taken from the bucket before the charge, which a lease
// may still spend). stored reads the bucket as the store keeps it (an
// Admin's GetBucket).
func DebtSeenByEveryReplica(t *testing.T, ds []Decider, seen time.Duration, stored func(ctx context.Context, entity, resource string) (backend.Bucket, bool, error)) {
	t.Helper()
	if len(ds) != 3 {
		t.Fatalf("DebtSeenByEveryReplica wants three replicas, got %d", len(ds))
	}
	// 10 tokens a second: the test's own seconds repay little of a debt
	// of one burst.
	l := bucket.Limit{Name: "tpm", Amount: 600 * bucket.Milli, Period: bucket.Minute, Burst: 600 * bucket.Milli}
	req := func(hits uint64, charge bool) *backend.Request {
		return &backend.Request{Entity: "spread-tenant", Resource: "chat", Defaults: []bucket.Limit{l}, Hits: hits, Charge: charge}
	}
	decide := func(what string, d Decider, r *backend.Request) backend.Decision {
		t.Helper()
		dec, err := d.Decide(context.Background(), r)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return dec
	}
	for i, d := range ds {
		for range 3 {
			if !decide("warm-up check", d, req(0, false)).Allowed || !decide("warm-up charge", d, req(5, true)).Allowed {
				t.Fatalf("replica %d: a warm-up call on a bucket far from its limit was denied", i)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	decide("the charge", ds[0], req(1800, true))
	bk, ok, err := stored(context.Background(), "spread-tenant", "chat")
	if err != nil || !ok || len(bk.States) != 1 {
		t.Fatalf("reading the bucket after the charge: found %v, %v, %+v", ok, err, bk)
	}
	st := bk.States[0]
	if st.Tokens >= 0 {
		t.Fatalf("after a charge of three bursts the shared bucket holds %d millitokens, want debt", st.Tokens)
	}
	var out int64
	for _, o := range st.Out {
		out += o.Tokens
	}

	var admitted int64
	start := time.Now()
	deadline := start.Add(seen)
	for i, d := range ds[1:] {
		i++
		for {
			check := decide("a check after the charge", d, req(0, false))
			denied := !check.Allowed
			if i == 2 {
				ask := decide("an admission after the charge", d, req(5, false))
				if ask.Allowed {
					admitted += 5
				}
				denied = denied && !ask.Allowed
			}
			if denied {
				if left := check.Results[0].Tokens; left > 0 {
					t.Errorf("replica %d: a check denied in debt says %d millitokens are left", i, left)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d: its checks still pass %v after another replica charged the bucket into debt (admitted %d tokens meanwhile)", i, seen, admitted)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if admitted*bucket.Milli > out {
		t.Errorf("admitted %d tokens after the charge, beyond the %d millitokens out on lease", admitted, out)
	}
	t.Logf("after the charge on replica 0 the bucket held %d millitokens with %d out on lease; %d tokens admitted and every replica denying %v later", st.Tokens, out, admitted, time.Since(start).Round(time.Millisecond))
}
