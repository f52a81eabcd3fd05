package dynamodb

import (
	"testing"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// A batch that folds an unspent lease, denies its call and grants the
// lease the same tokens again, in the same window, changes nothing in
// the item and is not written; the lease then holds what it held, not
// that twice. It once got both back (the fold restored and the grant
// credited): a lease of one token held two, and paid a call of two
// that only one token in the table covered. Seen in CI as a day that
// admitted 501 tokens of a budget of 500, with three replicas at the
// limit; one replica reaches it here through the batch path every call
// queued behind a write takes, which denyFromSeen otherwise shortcuts.
func TestWriteNotNeededGrantsNothing(t *testing.T) {
	e := newEnv(t)
	b := e.replica(t, Options{})
	ad := e.admin(t, "")
	req := backend.Request{Entity: "e", Resource: "r", Defaults: []bucket.Limit{lim(t, "x", "1/hour", 10)}, Hits: 1}
	var admitted uint64
	for range 3 {
		e.clock.advance(10)
		if mustDecide(t, b, req).Allowed {
			admitted += req.Hits
		}
		waitBackground(t, b)
	}
	for step := range 6 {
		ts := mustTargets(t, b, &req)
		bk, ok, err := ad.GetBucket(t.Context(), req.Entity, req.Resource)
		if err != nil || !ok {
			t.Fatalf("step %d: bucket found %v, err %v", step, ok, err)
		}
		lb := ts[0].leased()
		held := b.leases.Peek(&lb)
		pool := bk.States[0].Tokens
		if held != nil {
			pool += held[0]
		}
		// More than the bucket and the lease hold together: denied, by a
		// batch that folds the lease and may grant it again.
		big := req
		big.Hits = uint64(pool/bucket.Milli + 1)
		c := newCall(t.Context(), &big, "")
		b.decideBatch(t.Context(), ts, []*call{c})
		if c.err != nil || c.allowed {
			t.Fatalf("step %d: a call of %d hits against %d millitokens: allowed %v, err %v", step, big.Hits, pool, c.allowed, c.err)
		}
		waitBackground(t, b)
		bk, _, err = ad.GetBucket(t.Context(), req.Entity, req.Resource)
		if err != nil {
			t.Fatal(err)
		}
		var out int64
		for _, o := range bk.States[0].Out {
			out += o.Tokens
		}
		var leased int64
		if h := b.leases.Peek(&lb); h != nil {
			leased = h[0]
		}
		t.Logf("step %d: the table holds %d and counts %d out; the lease holds %d", step, bk.States[0].Tokens, out, leased)
		if leased > out {
			t.Fatalf("step %d: the lease holds %d millitokens, the table counts %d out on lease", step, leased, out)
		}
	}
	// As a client sees it: the clock has moved 30 ms of a refill of one
	// an hour, so the calls that follow admit what is left of the burst
	// of 10, and no more.
	for range 20 {
		if !mustDecide(t, b, req).Allowed {
			break
		}
		admitted += req.Hits
	}
	if admitted > 10 {
		t.Errorf("admitted %d calls of one token from a burst of 10", admitted)
	}
}
