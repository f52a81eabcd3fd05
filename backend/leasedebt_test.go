package backend

import (
	"testing"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// A lease pays nothing while its view shows the limit in debt as a whole
// (the shared bucket plus every lease out at or below zero), and pays
// again once the view shows it above zero; the lease's own tokens are
// not a way around another replica's charges.
func TestLeasesDenyWhileTheLimitIsInDebt(t *testing.T) {
	l := testLimit("tpm", 1, 600) // a token a second: refill barely moves within a case
	b := leaseOn("k", l)
	bs := []LeaseBucket[string]{b}
	for _, c := range []struct {
		name        string
		tokens, out int64 // the shared bucket and what leases hold, whole tokens
		paid        bool
	}{
		{"far from the limit", 500, 20, true},
		{"the bucket in debt, the leases more", -5, 20, true},
		{"the bucket and the leases at zero together", -20, 20, false},
		{"deep in debt", -700, 20, false},
	} {
		ls, _ := newTestLeases()
		view := &testView{config: b.FP, states: map[string]bucket.State{
			"tpm": {Tokens: whole(c.tokens), Clock: leaseT0, Out: [bucket.LeaseSlots]bucket.Out{{Window: 1, Tokens: whole(c.out)}}}}}
		ls.Credit(&b, []int64{whole(10)}, view, nil, leaseT0)
		for _, hits := range []uint64{0, 1} {
			if _, _, paid := ls.Spend(bs, hits, leaseT0, 5, true); paid != c.paid {
				t.Errorf("%s: a call of %d hits paid %v, want %v", c.name, hits, paid, c.paid)
			}
		}
	}
}

// A lease's view is refreshed (a renewal starts, however full the lease)
// once it is a second old, on a bucket that charges come to and other
// replicas write; never on a bucket without charges or written by this
// replica alone, and not sooner than a second nor than a few round trips.
func TestLeasesRefreshTheViewOfACharged(t *testing.T) {
	l := testLimit("tpm", 1, 600)
	b := leaseOn("k", l)
	bs := []LeaseBucket[string]{b}
	for _, c := range []struct {
		name    string
		charged bool
		out     int64 // what the view counts out on lease, whole tokens; this replica's lease is not reported
		age     int64 // ms since the view
		rtt     int64
		renew   bool
	}{
		{"charged, shared, a second old", true, 20, 1000, 5, true},
		{"charged, shared, just under a second", true, 20, 999, 5, false},
		{"charged, shared, a second but under four round trips", true, 20, 1000, 300, false},
		{"never charged here", false, 20, 5000, 5, false},
		{"charged, written by this replica alone", true, 0, 5000, 5, false},
	} {
		ls, _ := newTestLeases()
		view := &testView{config: b.FP, states: map[string]bucket.State{
			"tpm": {Tokens: whole(500), Clock: leaseT0, Out: [bucket.LeaseSlots]bucket.Out{{Window: 1, Tokens: whole(c.out)}}}}}
		ls.Credit(&b, []int64{whole(100)}, view, nil, leaseT0)
		if c.charged {
			ls.Charged(bs, leaseT0)
		}
		_, renew, paid := ls.Spend(bs, 0, leaseT0+c.age, c.rtt, true)
		if !paid || (len(renew) == 1) != c.renew {
			t.Errorf("%s: paid %v, renew %v; want paid, renewal %v", c.name, paid, leaseKeys(renew), c.renew)
		}
	}
}
