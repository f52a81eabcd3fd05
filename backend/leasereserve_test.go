package backend

import (
	"testing"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// leaseStep is one call on a lease: a check of hits, or a charge.
type leaseStep struct {
	at     int64 // ms after leaseT0
	charge bool
	hits   uint64
	paid   bool // whether the lease pays it
}

// A check paid from a lease on a bucket that charges come to sets aside
// what those charges cost on average, and the lease pays checks only from
// what it holds free of set-asides: a replica whose checks' charges go to
// other replicas runs its lease down as its requests use tokens. A charge
// on this replica cancels the oldest set-aside before it is paid, so a
// request's two calls on one replica cost the lease the tokens used once;
// set-asides whose charges never come lapse after reserveLife.
func TestLeasesSetAsideWhatChargesCost(t *testing.T) {
	l := testLimit("tpm", 1, 600) // a token a second: refill barely moves within a case
	check := func(at int64, paid bool) leaseStep { return leaseStep{at: at, hits: 0, paid: paid} }
	charge := func(at int64, hits uint64) leaseStep { return leaseStep{at: at, charge: true, hits: hits, paid: true} }
	for _, c := range []struct {
		name  string
		steps []leaseStep
		held  int64 // whole tokens the lease holds at the end
	}{
		{"no charge yet: checks of zero hits cost nothing", []leaseStep{
			check(0, true), check(1, true), check(2, true), check(3, true), check(4, true), check(5, true)}, 10},
		{"charges elsewhere: four checks set aside the eight tokens left, the fifth is not paid", []leaseStep{
			charge(0, 2), // paid from the lease: the mean charge is 2
			check(1, true), check(2, true), check(3, true), check(4, true), check(5, false)}, 8},
		{"a request's two calls on this replica", []leaseStep{
			charge(0, 3), check(1, true), charge(2, 3), check(3, true), charge(4, 3), check(5, false)}, 1},
		{"set-asides lapse after reserveLife", []leaseStep{
			charge(0, 3), check(1, true), check(2, true), check(3, false),
			check(1+reserveLife, false), check(2+reserveLife, true), check(2+reserveLife, false)}, 7},
	} {
		ls, _ := newTestLeases()
		b := leaseOn("k", l)
		bs := []LeaseBucket[string]{b}
		view := &testView{config: b.FP, states: map[string]bucket.State{"tpm": {Tokens: whole(500), Clock: leaseT0}}}
		ls.Credit(&b, []int64{whole(10)}, view, nil, leaseT0)
		for i, s := range c.steps {
			now := leaseT0 + s.at
			if s.charge {
				ls.Charged(bs, s.hits, now)
			}
			if _, _, paid := ls.Spend(bs, s.hits, now, 5, true, s.charge); paid != s.paid {
				t.Errorf("%s: step %d (%+v) paid %v, want %v", c.name, i, s, paid, s.paid)
			}
		}
		if held := ls.Peek(&b); held == nil || held[0] != whole(c.held) {
			t.Errorf("%s: the lease holds %v millitokens, want %d tokens: set-asides move none", c.name, held, c.held)
		}
	}
}
