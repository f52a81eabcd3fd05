package backend

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/lease"
)

// testHorizon is short enough that expiry and idleness are a few clock
// jumps away, long enough that the demand estimates are not all decay.
const testHorizon = 10_000

// leaseT0 is far from the epoch: a zero time means "never" to several fields.
const leaseT0 = int64(1_700_000_000_000)

// testView is a bucket as a write left it, with nothing behind it.
type testView struct {
	states  map[string]bucket.State
	expires int64 // ms; 0: never
	config  string
}

func (v *testView) StateOf(name string) (bucket.State, bool) {
	s, ok := v.states[name]
	return s, ok
}

func (v *testView) Expired(now int64) bool { return v.expires > 0 && now >= v.expires }

func (v *testView) Config() string { return v.config }

func newTestLeases() (*Leases[string], *LeaseStats) {
	stats := &LeaseStats{}
	return NewLeases(lease.Policy{Horizon: testHorizon}, stats, func(a, b string) bool { return a < b }), stats
}

// testLimit is a limit refilling perSecond tokens a second up to burst tokens.
func testLimit(name string, perSecond, burst int64) bucket.Limit {
	return bucket.Limit{Name: name, Amount: perSecond * bucket.Milli, Period: bucket.Second, Burst: burst * bucket.Milli}
}

func perRequestLimit(l bucket.Limit) bucket.Limit {
	l.PerRequest = true
	return l
}

func leaseOn(key string, limits ...bucket.Limit) LeaseBucket[string] {
	return LeaseBucket[string]{Key: key, Res: Resolved{Limits: limits, Level: LevelResource}, FP: bucket.Fingerprint(limits)}
}

// whole is n tokens, in millitokens.
func whole(n int64) int64 { return n * bucket.Milli }

type leaseStatsSnap struct {
	Leased, Dropped uint64
	Outstanding     int64
}

func snapStats(s *LeaseStats) leaseStatsSnap {
	return leaseStatsSnap{Leased: s.Leased.Load(), Dropped: s.LeaseDropped.Load(), Outstanding: s.LeaseOutstanding.Load()}
}

func leaseKeys(bs []LeaseBucket[string]) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.Key)
	}
	slices.Sort(out)
	return out
}

func TestLeasesFreshPaysNothing(t *testing.T) {
	ls, stats := newTestLeases()
	b := leaseOn("k", testLimit("rpm", 100, 100))
	for _, arriving := range []bool{true, false} {
		results, renew, paid := ls.Spend([]LeaseBucket[string]{b}, 1, leaseT0, 0, arriving)
		if paid || results != nil || renew != nil {
			t.Fatalf("arriving=%v: a fresh lease paid: %v %v %v", arriving, results, renew, paid)
		}
	}
	if got := snapStats(stats); got != (leaseStatsSnap{}) {
		t.Fatalf("stats after unpaid calls = %+v, want zero", got)
	}
	// The call counted as demand though nothing paid it: the next grant
	// is sized from it.
	if asks := ls.Asks(&b, nil, leaseT0, 0); len(asks) != 1 || !(asks[0].Own > 0) {
		t.Fatalf("Asks after an arriving call = %+v, want demand", asks)
	}
	// A call handed back from a batch was counted when it arrived.
	other := leaseOn("other", testLimit("rpm", 100, 100))
	ls.Spend([]LeaseBucket[string]{other}, 1, leaseT0, 0, false)
	if asks := ls.Asks(&other, nil, leaseT0, 0); asks[0].Own != 0 {
		t.Fatalf("a call that was not arriving counted as demand: %+v", asks)
	}
}

func TestLeasesSpendPaysWhileTheLeaseCovers(t *testing.T) {
	rpm, tpm := testLimit("rpm", 100, 100), testLimit("tpm", 1000, 1000)
	cases := []struct {
		name     string
		limits   []bucket.Limit
		grant    []int64
		hits     []uint64
		wantPaid []bool
		left     []int64 // what the lease holds after the calls
	}{
		{"one token a call", []bucket.Limit{rpm}, []int64{whole(3)}, []uint64{1, 1, 1, 1},
			[]bool{true, true, true, false}, []int64{0}},
		{"a call bigger than what is left is not paid, and takes nothing", []bucket.Limit{rpm}, []int64{whole(3)}, []uint64{2, 2, 1},
			[]bool{true, false, true}, []int64{0}},
		{"a check costs nothing, and needs a token", []bucket.Limit{rpm}, []int64{whole(1)}, []uint64{0, 0, 1, 0},
			[]bool{true, true, true, false}, []int64{0}},
		{"a per-request limit costs one token whatever the hits", []bucket.Limit{perRequestLimit(rpm)}, []int64{whole(2)}, []uint64{50, 7, 1},
			[]bool{true, true, false}, []int64{0}},
		{"every limit must cover the call", []bucket.Limit{perRequestLimit(rpm), tpm}, []int64{whole(5), whole(10)}, []uint64{4, 4, 4, 2},
			[]bool{true, true, false, true}, []int64{whole(2), 0}},
		{"a limit granted nothing pays nothing", []bucket.Limit{rpm, tpm}, []int64{whole(5), 0}, []uint64{1},
			[]bool{false}, []int64{whole(5), 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ls, stats := newTestLeases()
			b := leaseOn("k", c.limits...)
			ls.Credit(&b, c.grant, nil, nil, leaseT0)
			held := slices.Clone(c.grant)
			for i, hits := range c.hits {
				results, _, paid := ls.Spend([]LeaseBucket[string]{b}, hits, leaseT0+int64(i), 0, true)
				if paid != c.wantPaid[i] {
					t.Fatalf("call %d (%d hits): paid = %v, want %v", i, hits, paid, c.wantPaid[i])
				}
				if !paid {
					if results != nil {
						t.Fatalf("call %d: an unpaid call has results %+v", i, results)
					}
					continue
				}
				if len(results) != len(c.limits) {
					t.Fatalf("call %d: %d results for %d limits", i, len(results), len(c.limits))
				}
				for j, l := range c.limits {
					held[j] -= bucket.Cost(l, hits)
					// No view: the bucket counts as empty, and the
					// result is the lease alone.
					want := bucket.Result{Cost: bucket.Cost(l, hits), Tokens: min(held[j], l.Burst-bucket.Cost(l, hits)), Allowed: true}
					want.Wait = bucket.Wait(l, bucket.State{Tokens: want.Tokens, Clock: leaseT0 + int64(i)}, l.Burst, leaseT0+int64(i))
					if results[j] != want {
						t.Fatalf("call %d, limit %s: result %+v, want %+v", i, l.Name, results[j], want)
					}
				}
			}
			// Peek says nil for an empty lease.
			sum, want := sumMilli(c.left), c.left
			if sum == 0 {
				want = nil
			}
			if got := ls.Peek(&b); !slices.Equal(got, want) || (got == nil) != (want == nil) {
				t.Fatalf("lease holds %v, want %v", got, want)
			}
			if got := stats.LeaseOutstanding.Load(); got != sum {
				t.Fatalf("LeaseOutstanding = %d, want %d", got, sum)
			}
		})
	}
}

// A result is the bucket as the replica's last write left it, refilled to
// now, plus the lease, never above what one bucket would hold after
// paying.
func TestLeasesSpendResultTokens(t *testing.T) {
	l := testLimit("rpm", 100, 100) // a token every 10 ms
	b := leaseOn("k", l)
	now := leaseT0 + 1_000
	cases := []struct {
		name       string
		view       BucketView
		wantTokens int64
		wantWait   int64
	}{
		{"no view: the lease alone", nil, whole(19), 810},
		{"the view refilled to now, plus the lease", &testView{states: map[string]bucket.State{"rpm": {Tokens: whole(50), Clock: now - 100}}, config: b.FP},
			whole(50 + 10 + 19), 210},
		{"capped at the burst less the cost", &testView{states: map[string]bucket.State{"rpm": {Tokens: whole(90), Clock: now - 100}}, config: b.FP},
			whole(99), 10},
		{"an expired view counts as absent", &testView{states: map[string]bucket.State{"rpm": {Tokens: whole(50), Clock: now}}, config: b.FP, expires: now},
			whole(19), 810},
		{"a view under other limits counts as absent", &testView{states: map[string]bucket.State{"rpm": {Tokens: whole(50), Clock: now}}, config: "other"},
			whole(19), 810},
		{"a view without the limit counts as absent", &testView{states: map[string]bucket.State{"tpm": {Tokens: whole(50), Clock: now}}, config: b.FP},
			whole(19), 810},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ls, _ := newTestLeases()
			ls.Credit(&b, []int64{whole(20)}, c.view, nil, leaseT0)
			results, _, paid := ls.Spend([]LeaseBucket[string]{b}, 1, now, 0, true)
			if !paid {
				t.Fatal("not paid")
			}
			want := bucket.Result{Cost: whole(1), Tokens: c.wantTokens, Allowed: true, Wait: c.wantWait}
			if results[0] != want {
				t.Fatalf("result %+v, want %+v", results[0], want)
			}
		})
	}
}

// A cascade is paid from both leases or from neither, and reports in the
// order it was asked, whichever lease is locked first.
func TestLeasesCascade(t *testing.T) {
	child, parent := testLimit("rpm", 100, 100), testLimit("tpm", 1000, 1000)
	cases := []struct {
		name         string
		first, other string // keys: "a" sorts before "b"
		grantFirst   int64
		grantOther   int64
		wantPaid     bool
	}{
		{"both pay, asked in key order", "a", "b", whole(5), whole(9), true},
		{"both pay, asked against key order", "b", "a", whole(5), whole(9), true},
		{"the first cannot pay", "b", "a", 0, whole(9), false},
		{"the second cannot pay", "b", "a", whole(5), 0, false},
		{"the second cannot pay, key order", "a", "b", whole(5), 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ls, stats := newTestLeases()
			bs := []LeaseBucket[string]{leaseOn(c.first, child), leaseOn(c.other, parent)}
			if c.grantFirst > 0 {
				ls.Credit(&bs[0], []int64{c.grantFirst}, nil, nil, leaseT0)
			}
			if c.grantOther > 0 {
				ls.Credit(&bs[1], []int64{c.grantOther}, nil, nil, leaseT0)
			}
			results, _, paid := ls.Spend(bs, 2, leaseT0+1, 0, true)
			if paid != c.wantPaid {
				t.Fatalf("paid = %v, want %v", paid, c.wantPaid)
			}
			if !paid {
				if got := stats.LeaseOutstanding.Load(); got != c.grantFirst+c.grantOther {
					t.Fatalf("an unpaid cascade took tokens: outstanding %d, want %d", got, c.grantFirst+c.grantOther)
				}
				return
			}
			want := []bucket.Result{
				{Cost: whole(2), Tokens: c.grantFirst - whole(2), Allowed: true},
				{Cost: whole(2), Tokens: c.grantOther - whole(2), Allowed: true},
			}
			want[0].Wait = bucket.Wait(child, bucket.State{Tokens: want[0].Tokens, Clock: leaseT0 + 1}, child.Burst, leaseT0+1)
			want[1].Wait = bucket.Wait(parent, bucket.State{Tokens: want[1].Tokens, Clock: leaseT0 + 1}, parent.Burst, leaseT0+1)
			if !slices.Equal(results, want) {
				t.Fatalf("results %+v, want %+v (bs order)", results, want)
			}
		})
	}
}

// LeaseStats move with every operation, by exactly what it moved.
func TestLeaseStats(t *testing.T) {
	ls, stats := newTestLeases()
	rpm, tpm := testLimit("rpm", 100, 100), testLimit("tpm", 1000, 1000)
	b := leaseOn("k", rpm, tpm)
	moved := leaseOn("k", tpm) // the same bucket after rpm was removed
	var withdrawn []int64
	steps := []struct {
		name string
		do   func()
		want leaseStatsSnap
	}{
		{"a grant", func() { ls.Credit(&b, []int64{whole(10), whole(20)}, nil, nil, leaseT0) },
			leaseStatsSnap{Leased: uint64(whole(30)), Outstanding: whole(30)}},
		{"a write that granted nothing", func() { ls.Credit(&b, nil, nil, nil, leaseT0) },
			leaseStatsSnap{Leased: uint64(whole(30)), Outstanding: whole(30)}},
		{"a call nobody took the answer of", func() { ls.Add(&b, []int64{whole(1), whole(3)}, leaseT0) },
			leaseStatsSnap{Leased: uint64(whole(34)), Outstanding: whole(34)}},
		{"a call paid", func() { ls.Spend([]LeaseBucket[string]{b}, 2, leaseT0+1, 0, true) },
			leaseStatsSnap{Leased: uint64(whole(34)), Outstanding: whole(30)}},
		{"an unpaid call", func() { ls.Spend([]LeaseBucket[string]{b}, 50, leaseT0+1, 0, true) },
			leaseStatsSnap{Leased: uint64(whole(34)), Outstanding: whole(30)}},
		{"a withdrawal", func() { withdrawn = ls.Withdraw(&b) },
			leaseStatsSnap{Leased: uint64(whole(34)), Outstanding: 0}},
		{"restored", func() { ls.Restore(&b, withdrawn) },
			leaseStatsSnap{Leased: uint64(whole(34)), Outstanding: whole(30)}},
		{"withdrawn again, then dropped", func() { ls.Drop(ls.Withdraw(&b)) },
			leaseStatsSnap{Leased: uint64(whole(34)), Dropped: uint64(whole(30))}},
		{"a grant after", func() { ls.Credit(&b, []int64{whole(4), whole(6)}, nil, nil, leaseT0+2) },
			leaseStatsSnap{Leased: uint64(whole(44)), Dropped: uint64(whole(30)), Outstanding: whole(10)}},
		// rpm's tokens go with its limit: only tpm's come out.
		{"withdrawn under limits without rpm", func() { withdrawn = ls.Withdraw(&moved) },
			leaseStatsSnap{Leased: uint64(whole(44)), Dropped: uint64(whole(34))}},
		{"restored under them", func() { ls.Restore(&moved, withdrawn) },
			leaseStatsSnap{Leased: uint64(whole(44)), Dropped: uint64(whole(34)), Outstanding: whole(6)}},
		// The lease holds tokens under other limits: what arrives under
		// the old ones cannot join them.
		{"a grant under the old limits", func() { ls.Credit(&b, []int64{whole(1), whole(1)}, nil, nil, leaseT0+3) },
			leaseStatsSnap{Leased: uint64(whole(44)), Dropped: uint64(whole(36)), Outstanding: whole(6)}},
		{"an add under the old limits", func() { ls.Add(&b, []int64{whole(1), 0}, leaseT0+3) },
			leaseStatsSnap{Leased: uint64(whole(44)), Dropped: uint64(whole(37)), Outstanding: whole(6)}},
		{"a restore under the old limits", func() { ls.Restore(&b, []int64{0, whole(2)}) },
			leaseStatsSnap{Leased: uint64(whole(44)), Dropped: uint64(whole(39)), Outstanding: whole(6)}},
		{"nothing to restore", func() { ls.Restore(&b, nil) },
			leaseStatsSnap{Leased: uint64(whole(44)), Dropped: uint64(whole(39)), Outstanding: whole(6)}},
	}
	for _, s := range steps {
		s.do()
		if got := snapStats(stats); got != s.want {
			t.Fatalf("after %s: stats %+v, want %+v", s.name, got, s.want)
		}
	}
}

func TestLeasesRenew(t *testing.T) {
	b := leaseOn("k", testLimit("rpm", 100, 100))
	bs := []LeaseBucket[string]{b}

	t.Run("at half the last grant, once", func(t *testing.T) {
		ls, _ := newTestLeases()
		ls.Credit(&b, []int64{whole(10)}, nil, nil, leaseT0)
		for i := range 4 {
			if _, renew, _ := ls.Spend(bs, 1, leaseT0+int64(i), 0, true); renew != nil {
				t.Fatalf("renewal asked with %d of 10 tokens left", 9-i)
			}
		}
		_, renew, paid := ls.Spend(bs, 1, leaseT0+5, 0, true)
		if !paid || !slices.Equal(leaseKeys(renew), []string{"k"}) || !ls.Busy() {
			t.Fatalf("at 5 of 10 tokens: paid %v, renew %v, busy %v; want a renewal", paid, renew, ls.Busy())
		}
		if _, renew, _ := ls.Spend(bs, 1, leaseT0+6, 0, true); renew != nil {
			t.Fatal("a second renewal while the first is under way")
		}
		if ls.StartRenewal(&b) {
			t.Fatal("StartRenewal while a renewal is under way")
		}
		ls.Idle("k")
		if ls.Busy() {
			t.Fatal("busy after Idle")
		}
		if _, renew, _ := ls.Spend(bs, 1, leaseT0+7, 0, true); len(renew) != 1 {
			t.Fatal("a lease still low after its renewal finished is not renewed")
		}
		ls.Idle("k")
		if !ls.StartRenewal(&b) || !ls.Busy() {
			t.Fatal("StartRenewal refused on an idle lease")
		}
	})

	t.Run("when it would not last three round trips", func(t *testing.T) {
		ls, _ := newTestLeases()
		ls.Credit(&b, []int64{whole(100)}, nil, nil, leaseT0)
		// One call over the policy's window reads as about a millitoken
		// a ms: 99 tokens last 99 s, less than three round trips of 40 s.
		if _, renew, _ := ls.Spend(bs, 1, leaseT0+1, 40_000, true); len(renew) != 1 {
			t.Fatal("a lease that would run out before its renewal is back is not renewed")
		}
		ls.Idle("k")
		if _, renew, _ := ls.Spend(bs, 1, leaseT0+2, 10, true); renew != nil {
			t.Fatal("renewed with most of the lease left and a near store")
		}
	})

	t.Run("a lease granted nothing is not renewed ahead", func(t *testing.T) {
		ls, _ := newTestLeases()
		ls.Add(&b, []int64{whole(2)}, leaseT0)
		if _, renew, paid := ls.Spend(bs, 2, leaseT0+1, 1000, true); !paid || renew != nil {
			t.Fatalf("paid %v, renew %v; want paid, no renewal", paid, renew)
		}
	})
}

// Withdraw hands a decision the lease's tokens lined up with the limits
// the decision resolved, by name; Restore puts them back under those.
func TestLeasesWithdrawRestore(t *testing.T) {
	a, b, c := testLimit("a", 10, 10), testLimit("b", 20, 20), testLimit("c", 30, 30)
	bBigger := testLimit("b", 20, 40)
	cases := []struct {
		name     string
		held     []bucket.Limit
		tokens   []int64
		now      []bucket.Limit
		want     []int64
		dropped  int64
		restored []int64 // Peek under now's limits after Restore
	}{
		{"the same limits", []bucket.Limit{a, b}, []int64{whole(1), whole(2)}, []bucket.Limit{a, b},
			[]int64{whole(1), whole(2)}, 0, []int64{whole(1), whole(2)}},
		{"reordered", []bucket.Limit{a, b}, []int64{whole(1), whole(2)}, []bucket.Limit{b, a},
			[]int64{whole(2), whole(1)}, 0, []int64{whole(2), whole(1)}},
		{"a limit removed", []bucket.Limit{a, b}, []int64{whole(1), whole(2)}, []bucket.Limit{b},
			[]int64{whole(2)}, whole(1), []int64{whole(2)}},
		{"a limit added", []bucket.Limit{a}, []int64{whole(1)}, []bucket.Limit{a, c},
			[]int64{whole(1), 0}, 0, []int64{whole(1), 0}},
		{"a limit's burst changed", []bucket.Limit{a, b}, []int64{whole(1), whole(2)}, []bucket.Limit{a, bBigger},
			[]int64{whole(1), whole(2)}, 0, []int64{whole(1), whole(2)}},
		{"nothing left in common", []bucket.Limit{a}, []int64{whole(1)}, []bucket.Limit{c},
			[]int64{0}, whole(1), nil},
		{"nothing held", []bucket.Limit{a}, []int64{0}, []bucket.Limit{a},
			nil, 0, nil},
	}
	for _, cs := range cases {
		t.Run(cs.name, func(t *testing.T) {
			ls, stats := newTestLeases()
			old, now := leaseOn("k", cs.held...), leaseOn("k", cs.now...)
			ls.Credit(&old, cs.tokens, nil, nil, leaseT0)
			got := ls.Withdraw(&now)
			if !slices.Equal(got, cs.want) || (got == nil) != (cs.want == nil) {
				t.Fatalf("Withdraw = %v, want %v", got, cs.want)
			}
			if d := stats.LeaseDropped.Load(); d != uint64(cs.dropped) {
				t.Fatalf("dropped %d, want %d", d, cs.dropped)
			}
			if o := stats.LeaseOutstanding.Load(); o != 0 {
				t.Fatalf("outstanding %d after Withdraw, want 0", o)
			}
			if p := ls.Peek(&old); p != nil {
				t.Fatalf("the lease still holds %v after Withdraw", p)
			}
			ls.Restore(&now, got)
			if p := ls.Peek(&now); !slices.Equal(p, cs.restored) {
				t.Fatalf("after Restore the lease holds %v, want %v", p, cs.restored)
			}
			var sum int64
			for _, v := range got {
				sum += v
			}
			if o := stats.LeaseOutstanding.Load(); o != sum {
				t.Fatalf("outstanding %d after Restore, want %d", o, sum)
			}
		})
	}

	t.Run("a key never leased", func(t *testing.T) {
		ls, _ := newTestLeases()
		b := leaseOn("k", a)
		if got := ls.Withdraw(&b); got != nil {
			t.Fatalf("Withdraw = %v, want nil", got)
		}
		if got := ls.Peek(&b); got != nil {
			t.Fatalf("Peek = %v, want nil", got)
		}
	})
}

// Tokens taken under limits that have changed since are not spent under
// the new ones; they wait for a decision that folds them back.
func TestLeasesTokensUnderOtherLimitsWait(t *testing.T) {
	ls, stats := newTestLeases()
	old := leaseOn("k", testLimit("rpm", 100, 100))
	now := leaseOn("k", testLimit("rpm", 100, 200)) // same name, new burst
	ls.Credit(&old, []int64{whole(10)}, nil, nil, leaseT0)
	if _, _, paid := ls.Spend([]LeaseBucket[string]{now}, 1, leaseT0+1, 0, true); paid {
		t.Fatal("paid from tokens taken under other limits")
	}
	if got := ls.Peek(&old); !slices.Equal(got, []int64{whole(10)}) {
		t.Fatalf("the old lease holds %v, want 10 tokens", got)
	}
	if got := ls.Peek(&now); got != nil {
		t.Fatalf("Peek under the new limits = %v, want nil", got)
	}
	if got := ls.Asks(&now, nil, leaseT0+1, 0); got != nil {
		t.Fatalf("Asks under the new limits = %+v, want nil (grant nothing)", got)
	}
	if ls.StartRenewal(&now) {
		t.Fatal("a renewal under the new limits started")
	}
	// The decision folds them: under the new limits from then on.
	if got := ls.Withdraw(&now); !slices.Equal(got, []int64{whole(10)}) {
		t.Fatalf("Withdraw under the new limits = %v, want the 10 tokens", got)
	}
	ls.Credit(&now, []int64{whole(5)}, nil, nil, leaseT0+2)
	if _, _, paid := ls.Spend([]LeaseBucket[string]{now}, 1, leaseT0+3, 0, true); !paid {
		t.Fatal("a lease folded and granted under the new limits does not pay")
	}
	if got := snapStats(stats); got != (leaseStatsSnap{Leased: uint64(whole(15)), Outstanding: whole(4)}) {
		t.Fatalf("stats %+v", got)
	}
}

func TestLeasesExpiry(t *testing.T) {
	b := leaseOn("k", testLimit("rpm", 100, 100))
	bs := []LeaseBucket[string]{b}
	expires := leaseT0 + 2*testHorizon
	cases := []struct {
		name     string
		setup    func(ls *Leases[string])
		at       int64
		wantPaid bool
	}{
		{"just before two horizons", func(*Leases[string]) {}, expires - 1, true},
		{"at two horizons", func(*Leases[string]) {}, expires, false},
		{"after", func(*Leases[string]) {}, expires + testHorizon, false},
		{"spending does not extend it", func(ls *Leases[string]) {
			ls.Spend(bs, 1, expires-10, 0, true)
		}, expires, false},
		{"a grant does", func(ls *Leases[string]) {
			ls.Credit(&b, []int64{whole(1)}, nil, nil, leaseT0+testHorizon)
		}, expires, true},
		{"a write granting nothing does not", func(ls *Leases[string]) {
			ls.Credit(&b, nil, nil, nil, leaseT0+testHorizon)
		}, expires, false},
		{"an add does, from its own time", func(ls *Leases[string]) {
			ls.Add(&b, []int64{whole(1)}, leaseT0+testHorizon)
		}, expires + testHorizon - 1, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ls, _ := newTestLeases()
			ls.Credit(&b, []int64{whole(10)}, nil, nil, leaseT0)
			c.setup(ls)
			if _, _, paid := ls.Spend(bs, 1, c.at, 0, true); paid != c.wantPaid {
				t.Fatalf("paid = %v at %+d ms, want %v", paid, c.at-leaseT0, c.wantPaid)
			}
		})
	}
}

func TestLeasesDue(t *testing.T) {
	b := leaseOn("k", testLimit("rpm", 100, 100))
	bs := []LeaseBucket[string]{b}
	cases := []struct {
		name  string
		setup func(ls *Leases[string]) // from leaseT0
		at    int64
		want  []string
	}{
		{"in use", func(ls *Leases[string]) {
			ls.Credit(&b, []int64{whole(10)}, nil, nil, leaseT0)
			ls.Spend(bs, 1, leaseT0+testHorizon/2, 0, true)
		}, leaseT0 + testHorizon, nil},
		{"idle for a horizon", func(ls *Leases[string]) {
			ls.Credit(&b, []int64{whole(10)}, nil, nil, leaseT0)
			ls.Spend(bs, 1, leaseT0+1, 0, true)
		}, leaseT0 + 1 + testHorizon, []string{"k"}},
		{"idle a ms short of a horizon", func(ls *Leases[string]) {
			ls.Credit(&b, []int64{whole(10)}, nil, nil, leaseT0)
			ls.Spend(bs, 1, leaseT0+1, 0, true)
		}, leaseT0 + testHorizon, nil},
		// A call the lease turned away is a use of it too.
		{"asked, not paid", func(ls *Leases[string]) {
			ls.Credit(&b, []int64{whole(1)}, nil, nil, leaseT0)
			ls.Spend(bs, 5, leaseT0+testHorizon/2, 0, true)
		}, leaseT0 + testHorizon, nil},
		{"expired while in use", func(ls *Leases[string]) {
			ls.Credit(&b, []int64{whole(100)}, nil, nil, leaseT0)
			for at := leaseT0; at < leaseT0+2*testHorizon; at += testHorizon / 4 {
				ls.Spend(bs, 1, at, 0, true)
			}
		}, leaseT0 + 2*testHorizon, []string{"k"}},
		{"empty", func(ls *Leases[string]) {
			ls.Credit(&b, []int64{whole(1)}, nil, nil, leaseT0)
			ls.Spend(bs, 1, leaseT0, 0, true)
		}, leaseT0 + 3*testHorizon, nil},
		{"busy", func(ls *Leases[string]) {
			ls.Credit(&b, []int64{whole(10)}, nil, nil, leaseT0)
			ls.StartRenewal(&b)
		}, leaseT0 + 3*testHorizon, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ls, _ := newTestLeases()
			c.setup(ls)
			due := ls.Due(c.at)
			if got := leaseKeys(due); !slices.Equal(got, c.want) {
				t.Fatalf("Due = %v, want %v", got, c.want)
			}
			if len(due) == 0 {
				return
			}
			if due[0].FP != b.FP || len(due[0].Res.Limits) != 1 || due[0].Res.Limits[0] != b.Res.Limits[0] {
				t.Fatalf("Due names the lease as %+v, want its limits", due[0])
			}
			if !ls.Busy() || ls.StartRenewal(&b) {
				t.Fatal("a lease listed due is not marked busy")
			}
			if again := ls.Due(c.at); again != nil {
				t.Fatalf("listed again while its return is under way: %v", leaseKeys(again))
			}
			ls.Idle("k")
			if again := ls.Due(c.at); len(again) != 1 {
				t.Fatal("a lease whose return failed is not listed again")
			}
		})
	}
}

// An empty lease unused for two horizons is forgotten with what it knew
// (here: that another writer shares the bucket); a lease still holding
// tokens is kept whatever its age.
func TestLeasesDueForgetsEmptyLeases(t *testing.T) {
	ls, _ := newTestLeases()
	empty, full := leaseOn("empty", testLimit("rpm", 100, 100)), leaseOn("full", testLimit("rpm", 100, 100))
	shared := &testView{states: map[string]bucket.State{"rpm": {Consumed: whole(5)}}, config: empty.FP}
	written := []bucket.State{{Consumed: whole(1)}}
	ls.Credit(&empty, []int64{whole(1)}, shared, written, leaseT0)
	ls.Spend([]LeaseBucket[string]{empty}, 1, leaseT0+1, 0, true)
	ls.Idle("empty") // the renewal its last token asked for granted nothing
	shared.config = full.FP
	ls.Credit(&full, []int64{whole(1)}, shared, written, leaseT0+1)
	if !ls.SharedSince("empty", leaseT0) || !ls.SharedSince("full", leaseT0) {
		t.Fatal("a write that found another writer's tokens gone is not remembered")
	}
	if ls.SharedSince("empty", leaseT0+2) {
		t.Fatal("SharedSince reports a sharing before since")
	}
	for _, at := range []int64{leaseT0 + 1 + 2*testHorizon - 1, leaseT0 + 1 + 2*testHorizon} {
		// The full one is due (idle), and stays however often its
		// return fails.
		if got := leaseKeys(ls.Due(at)); !slices.Equal(got, []string{"full"}) {
			t.Fatalf("Due = %v, want [full]", got)
		}
		ls.Idle("full")
		if at < leaseT0+1+2*testHorizon && !ls.SharedSince("empty", leaseT0) {
			t.Fatal("an empty lease forgotten before two horizons")
		}
	}
	if !ls.SharedSince("full", leaseT0) || ls.SharedSince("empty", leaseT0) {
		t.Fatal("Due kept the empty lease or forgot the full one")
	}
	// What a write of this replica took itself is not another writer.
	alone, _ := newTestLeases()
	mine := &testView{states: map[string]bucket.State{"rpm": {Consumed: whole(1)}}, config: empty.FP}
	alone.Credit(&empty, []int64{whole(1)}, mine, written, leaseT0)
	if alone.SharedSince("empty", 0) {
		t.Fatal("a replica's own write counts as another writer")
	}
}

func TestLeasesOutrun(t *testing.T) {
	b := leaseOn("k", testLimit("rpm", 100, 100))
	bs := []LeaseBucket[string]{b}
	granted := func(ls *Leases[string]) { ls.Credit(&b, []int64{whole(2)}, nil, nil, leaseT0) }
	dry := func(ls *Leases[string]) { ls.Spend(bs, 5, leaseT0+1, 0, true) }
	busy := func(ls *Leases[string]) { ls.StartRenewal(&b) }
	cases := []struct {
		name  string
		setup []func(ls *Leases[string])
		ask   []LeaseBucket[string]
		at    int64
		want  bool
	}{
		{"granted, dry, a grant on the way", []func(*Leases[string]){granted, dry, busy}, bs, leaseT0 + 2, true},
		{"one bucket of a cascade", []func(*Leases[string]){granted, dry, busy},
			[]LeaseBucket[string]{leaseOn("j", testLimit("rpm", 100, 100)), b}, leaseT0 + 2, true},
		{"never granted", []func(*Leases[string]){dry, busy}, bs, leaseT0 + 2, false},
		{"a key never seen", nil, bs, leaseT0 + 2, false},
		{"not dry", []func(*Leases[string]){granted, busy}, bs, leaseT0 + 2, false},
		{"nothing on the way", []func(*Leases[string]){granted, dry}, bs, leaseT0 + 2, false},
		{"expired", []func(*Leases[string]){granted, dry, busy}, bs, leaseT0 + 2*testHorizon, false},
		{"a call handed back from a batch does not make it dry", []func(*Leases[string]){granted, busy, func(ls *Leases[string]) {
			ls.Spend(bs, 5, leaseT0+1, 0, false)
		}}, bs, leaseT0 + 2, false},
		{"the grant landed", []func(*Leases[string]){granted, dry, busy, func(ls *Leases[string]) {
			ls.Credit(&b, []int64{whole(2)}, nil, nil, leaseT0+2)
		}}, bs, leaseT0 + 3, false},
		{"asked under other limits", []func(*Leases[string]){granted, dry, busy},
			[]LeaseBucket[string]{leaseOn("k", testLimit("rpm", 100, 200))}, leaseT0 + 2, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ls, _ := newTestLeases()
			for _, f := range c.setup {
				f(ls)
			}
			if got := ls.Outrun(c.ask, c.at); got != c.want {
				t.Fatalf("Outrun = %v, want %v", got, c.want)
			}
		})
	}
}

// Beyond pays a call that cannot wait for the store from its lease, or
// says the lease is outrun: spent, marked dry under the same lock, with a
// grant on the way. It asks for a renewal before each try, and gives up
// after a few when neither holds.
func TestLeasesBeyond(t *testing.T) {
	b := leaseOn("k", testLimit("rpm", 100, 100))
	bs := []LeaseBucket[string]{b}
	granted := func(ls *Leases[string]) { ls.Credit(&b, []int64{whole(2)}, nil, nil, leaseT0) }
	spentByOthers := func(ls *Leases[string]) { ls.Spend(bs, 2, leaseT0+1, 0, true) } // paid: no dry mark
	cases := []struct {
		name              string
		setup             []func(ls *Leases[string])
		ask               []LeaseBucket[string]
		paid, outrun      bool
		renewals, started int
	}{
		{"tokens in the lease: paid", []func(*Leases[string]){granted}, bs, true, false, 1, 1},
		// The race Beyond closes: the grant landed (no dry mark), other
		// calls spent it, and its renewal was over before this call
		// looked: it starts the next one and is outrun.
		{"spent by others, no renewal under way: one is started, outrun", []func(*Leases[string]){granted, spentByOthers, func(ls *Leases[string]) { ls.Idle(b.Key) }}, bs, false, true, 1, 1},
		// Spending it all started a renewal already.
		{"spent by others, a renewal under way: outrun", []func(*Leases[string]){granted, spentByOthers}, bs, false, true, 1, 0},
		{"never granted: neither, after every try", []func(*Leases[string]){func(ls *Leases[string]) { ls.Spend(bs, 1, leaseT0, 0, true) }}, bs, false, false, beyondReachTries, 1},
		{"a key never seen: neither", nil, bs, false, false, beyondReachTries, 1},
		{"asked under other limits: neither", []func(*Leases[string]){granted, spentByOthers},
			[]LeaseBucket[string]{leaseOn("k", testLimit("rpm", 100, 200))}, false, false, beyondReachTries, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ls, _ := newTestLeases()
			for _, f := range c.setup {
				f(ls)
			}
			renewals, started := 0, 0
			renew := func() {
				renewals++
				for i := range c.ask {
					if ls.StartRenewal(&c.ask[i]) {
						started++
					}
				}
			}
			_, _, paid, outrun := ls.Beyond(c.ask, 1, leaseT0+2, 0, renew)
			if paid != c.paid || outrun != c.outrun || renewals != c.renewals || started != c.started {
				t.Fatalf("Beyond: paid %v, outrun %v, %d renewal asks, %d started; want %v, %v, %d, %d",
					paid, outrun, renewals, started, c.paid, c.outrun, c.renewals, c.started)
			}
			if outrun != ls.Outrun(c.ask, leaseT0+2) {
				t.Fatalf("Beyond said outrun %v, Outrun after it %v", outrun, !outrun)
			}
		})
	}
}

// AtLimit denies from memory a call its lease cannot pay only while this
// replica's last write, a few round trips ago at most, left the bucket
// unable to pay one hit, and a renewal is on its way (started by the call
// when none was); a bucket that held tokens, a write long past, a
// renewal that cannot start or other limits send the call to the store.
func TestLeasesAtLimit(t *testing.T) {
	l := testLimit("rpm", 100, 100)
	b := leaseOn("k", l)
	bs := []LeaseBucket[string]{b}
	part := b // a region's part of a global limit, under the same limits
	part.Res.Regional = true
	const rtt = 10
	left := func(tokens int64) *testView {
		return &testView{states: map[string]bucket.State{"rpm": {Tokens: tokens, Clock: leaseT0}}, config: b.FP}
	}
	wrote := func(grant, tokens int64) func(*Leases[string]) {
		return func(ls *Leases[string]) { ls.Credit(&b, []int64{grant}, left(tokens), nil, leaseT0) }
	}
	spent := func(ls *Leases[string]) { ls.Spend(bs, 2, leaseT0+1, rtt, true) }
	// others: a write that found another replica's taking since its view.
	others := func(ls *Leases[string]) {
		ls.Credit(&b, nil, &testView{states: map[string]bucket.State{"rpm": {Tokens: 0, Consumed: whole(5), Clock: leaseT0}}, config: b.FP},
			[]bucket.State{{Consumed: whole(1)}}, leaseT0)
	}
	renewing := func(ls *Leases[string]) { ls.StartRenewal(&b) }
	atLimitAt := func(at int64) func(*Leases[string]) {
		return func(ls *Leases[string]) { ls.AtLimit(bs, 1, at, rtt, func() {}) }
	}
	cases := []struct {
		name         string
		setup        []func(ls *Leases[string])
		ask          []LeaseBucket[string]
		at           int64
		paid, denied bool
	}{
		{"drained, the lease spent, a grant on its way: denied", []func(*Leases[string]){wrote(whole(2), 0), spent, renewing}, bs, leaseT0 + 2, false, true},
		{"drained, shared, nothing on its way: a renewal starts, denied", []func(*Leases[string]){wrote(whole(2), 0), others, spent, func(ls *Leases[string]) { ls.Idle(b.Key) }}, bs, leaseT0 + 2, false, true},
		{"drained, alone, nothing on its way: the store", []func(*Leases[string]){wrote(whole(2), 0), spent, func(ls *Leases[string]) { ls.Idle(b.Key) }}, bs, leaseT0 + 2, false, false},
		{"drained, alone, a region's part, nothing on its way: a renewal starts, denied", []func(*Leases[string]){wrote(whole(2), 0), spent, func(ls *Leases[string]) { ls.Idle(b.Key) }}, []LeaseBucket[string]{part}, leaseT0 + 2, false, true},
		{"drained, the lease pays: paid", []func(*Leases[string]){wrote(whole(2), 0), renewing}, bs, leaseT0 + 2, true, false},
		{"less than a hit left is drained", []func(*Leases[string]){wrote(whole(2), bucket.Milli-1), spent, renewing}, bs, leaseT0 + 2, false, true},
		{"a hit left: the store", []func(*Leases[string]){wrote(whole(2), whole(1)), spent, renewing}, bs, leaseT0 + 2, false, false},
		{"no grant, drained: denied", []func(*Leases[string]){wrote(0, 0), renewing}, bs, leaseT0 + 2, false, true},
		{"drained within a few round trips", []func(*Leases[string]){wrote(whole(2), 0), spent, renewing}, bs, leaseT0 + drainedRTTs*rtt, false, true},
		{"drained longer ago: the store", []func(*Leases[string]){wrote(whole(2), 0), spent, renewing}, bs, leaseT0 + drainedRTTs*rtt + 1, false, false},
		{"found drained while the renewal is on its way, which takes long: denied", []func(*Leases[string]){wrote(whole(2), 0), spent, renewing, atLimitAt(leaseT0 + 2)}, bs, leaseT0 + 10*drainedRTTs*rtt, false, true},
		{"found drained by the renewal before: the store", []func(*Leases[string]){wrote(whole(2), 0), spent, renewing, atLimitAt(leaseT0 + 2), func(ls *Leases[string]) { ls.Idle(b.Key) }, renewing}, bs, leaseT0 + drainedRTTs*rtt + 1, false, false},
		{"found drained, then a write landed: the store", []func(*Leases[string]){wrote(whole(2), 0), spent, renewing, atLimitAt(leaseT0 + 2), wrote(0, whole(5))}, bs, leaseT0 + drainedRTTs*rtt + 1, false, false},
		{"a key never written: the store", nil, bs, leaseT0 + 2, false, false},
		{"one bucket of a cascade drained", []func(*Leases[string]){wrote(whole(2), 0), spent, renewing, func(ls *Leases[string]) {
			j := leaseOn("j", l)
			ls.Credit(&j, nil, &testView{states: map[string]bucket.State{"rpm": {Tokens: whole(50), Clock: leaseT0}}, config: j.FP}, nil, leaseT0)
		}}, []LeaseBucket[string]{leaseOn("j", l), b}, leaseT0 + 2, false, true},
		{"a cascade over a bucket this replica never wrote: the store", []func(*Leases[string]){wrote(whole(2), 0), spent, renewing},
			[]LeaseBucket[string]{leaseOn("j", l), b}, leaseT0 + 2, false, false},
		{"asked under other limits: the store", []func(*Leases[string]){wrote(0, 0), renewing},
			[]LeaseBucket[string]{leaseOn("k", testLimit("rpm", 100, 200))}, leaseT0 + 2, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ls, _ := newTestLeases()
			for _, f := range c.setup {
				f(ls)
			}
			if _, _, paid, denied := ls.AtLimit(c.ask, 1, c.at, rtt, func() { ls.StartRenewal(&b) }); paid != c.paid || denied != c.denied {
				t.Fatalf("AtLimit: paid %v, denied %v; want %v, %v", paid, denied, c.paid, c.denied)
			}
		})
	}
	t.Run("drained, a renewal that cannot start: the store", func(t *testing.T) {
		ls, _ := newTestLeases()
		wrote(whole(2), 0)(ls)
		others(ls)
		spent(ls)
		ls.Idle(b.Key)
		tried := false
		if _, _, paid, denied := ls.AtLimit(bs, 1, leaseT0+2, rtt, func() { tried = true }); paid || denied || !tried {
			t.Fatalf("AtLimit: paid %v, denied %v, renewal tried %v; want the store, after trying", paid, denied, tried)
		}
	})
	t.Run("not drained: no renewal started", func(t *testing.T) {
		ls, _ := newTestLeases()
		wrote(whole(2), whole(1))(ls)
		spent(ls)
		ls.Idle(b.Key)
		if _, _, paid, denied := ls.AtLimit(bs, 1, leaseT0+2, rtt, func() { t.Fatal("renewal started on a bucket that was not drained") }); paid || denied {
			t.Fatalf("AtLimit: paid %v, denied %v; want the store", paid, denied)
		}
	})
	t.Run("a call that waited sees the bucket drained before it came", func(t *testing.T) {
		ls, _ := newTestLeases()
		wrote(0, 0)(ls)
		at := leaseT0 + drainedRTTs*rtt + 50
		if ls.Drained(bs, at, rtt, 0) {
			t.Fatal("drained 50 ms past a few round trips, for a call that just came")
		}
		if !ls.Drained(bs, at, rtt, 50) {
			t.Fatal("not drained for a call that came 50 ms ago, a few round trips after the write")
		}
		if ls.Drained(bs, at+1, rtt, 50) {
			t.Fatal("drained for a call that came more than a few round trips after the write")
		}
	})
	t.Run("no round trip known: the store", func(t *testing.T) {
		ls, _ := newTestLeases()
		wrote(0, 0)(ls)
		renewing(ls)
		if _, _, paid, denied := ls.AtLimit(bs, 1, leaseT0+1, 0, nil); paid || denied {
			t.Fatalf("AtLimit with no round trip: paid %v, denied %v", paid, denied)
		}
	})
}

func TestLeasesAsks(t *testing.T) {
	l := testLimit("rpm", 1000, 1000)
	b := leaseOn("k", l)
	bs := []LeaseBucket[string]{b}

	t.Run("a burst reads at its pace", func(t *testing.T) {
		ls, _ := newTestLeases()
		ls.Credit(&b, []int64{whole(100)}, nil, nil, leaseT0)
		for i := range 20 {
			if _, _, paid := ls.Spend(bs, 1, leaseT0+int64(i/4), 0, true); !paid {
				t.Fatal("not paid")
			}
		}
		// 20 tokens within 5 ms, read over at least 10 ms: about 2
		// tokens a ms, where the horizon's average alone says 0.02.
		a := ls.Asks(&b, nil, leaseT0+5, 0)
		if len(a) != 1 || a[0].Own < 1900 || a[0].Own > 2100 {
			t.Fatalf("Own = %+v, want about 2000 millitokens a ms", a)
		}
		spread, _ := newTestLeases()
		spread.Credit(&b, []int64{whole(100)}, nil, nil, leaseT0)
		for i := range 20 {
			spread.Spend(bs, 1, leaseT0+int64(i)*500, 0, true)
		}
		if s := spread.Asks(&b, nil, leaseT0+10_000, 0); !(s[0].Own < a[0].Own/10) {
			t.Fatalf("the same calls over 10 s read %v, the burst %v: want far less", s[0].Own, a[0].Own)
		}
	})

	t.Run("held", func(t *testing.T) {
		ls, _ := newTestLeases()
		ls.Credit(&b, []int64{whole(7)}, nil, nil, leaseT0)
		ls.Spend(bs, 2, leaseT0+1, 0, true)
		if a := ls.Asks(&b, nil, leaseT0+1, 0); a[0].Held != whole(5) {
			t.Fatalf("Held = %d, want %d", a[0].Held, whole(5))
		}
	})

	t.Run("the calls a dry lease turned away", func(t *testing.T) {
		// The same calls at the same times, paid by one lease and
		// turned away by the other: only their unmet need differs.
		paid, _ := newTestLeases()
		dryLs, _ := newTestLeases()
		paid.Credit(&b, []int64{whole(100)}, nil, nil, leaseT0)
		dryLs.Credit(&b, []int64{whole(1)}, nil, nil, leaseT0)
		for i := range 11 {
			at := leaseT0 + 1 + int64(i/5)
			paid.Spend(bs, 1, at, 0, true)
			dryLs.Spend(bs, 1, at, 0, true)
		}
		// Read over a round trip of 100 ms the calls are 100 a second;
		// the ten turned away within 2 ms, over unmetWindow ms, are a
		// thousand.
		const rtt = 100
		p, d := paid.Asks(&b, nil, leaseT0+4, rtt)[0].Own, dryLs.Asks(&b, nil, leaseT0+4, rtt)[0].Own
		if want := float64(whole(10)) / unmetWindow; d != want || !(p < want/5) {
			t.Fatalf("Own = %v turned away, %v paid; want %v turned away and far less paid", d, p, want)
		}
		// A grant meets them: from then on the demand is what arrived.
		dryLs.Credit(&b, []int64{whole(50)}, nil, nil, leaseT0+4)
		if p, d := paid.Asks(&b, nil, leaseT0+100, rtt)[0].Own, dryLs.Asks(&b, nil, leaseT0+100, rtt)[0].Own; d != p {
			t.Fatalf("Own after the grant = %v, want %v, as if the calls had been paid", d, p)
		}
	})

	t.Run("grow", func(t *testing.T) {
		cases := []struct {
			name string
			at   int64 // since the grant
			want int64
		}{
			{"renewed at once", 1, whole(10)},
			{"renewed just within half a horizon", testHorizon/2 - 1, whole(10)},
			{"renewed at half a horizon", testHorizon / 2, 0},
		}
		for _, c := range cases {
			ls, _ := newTestLeases()
			if a := ls.Asks(&b, nil, leaseT0, 0); a[0].Grow != 0 {
				t.Fatalf("%s: a lease never granted grows: %+v", c.name, a)
			}
			ls.Credit(&b, []int64{whole(10)}, nil, nil, leaseT0)
			if a := ls.Asks(&b, nil, leaseT0+c.at, 0); a[0].Grow != c.want {
				t.Fatalf("%s: Grow = %d, want %d", c.name, a[0].Grow, c.want)
			}
		}
	})

	t.Run("fleet", func(t *testing.T) {
		view := func(consumed int64, config string) *testView {
			return &testView{states: map[string]bucket.State{"rpm": {Consumed: consumed}}, config: config}
		}
		ls, _ := newTestLeases()
		var want lease.Counter
		readings := []struct {
			at       int64
			consumed int64
		}{{leaseT0, whole(1000)}, {leaseT0 + 100, whole(1010)}, {leaseT0 + 400, whole(1050)}, {leaseT0 + 2000, whole(1050)}}
		for _, r := range readings {
			want.Observe(r.consumed, r.at, testHorizon)
			a := ls.Asks(&b, view(r.consumed, b.FP), r.at, 0)
			if w := want.Arriving(r.at, testHorizon, lease.DefaultWindow); a[0].Fleet != w {
				t.Fatalf("at %+d ms: Fleet = %v, want %v", r.at-leaseT0, a[0].Fleet, w)
			}
		}
		if !(want.At(leaseT0+2000, testHorizon) > 0) {
			t.Fatal("the readings measured no taking")
		}
		// Readings of a bucket under other limits, or none, move nothing.
		before := ls.Asks(&b, nil, leaseT0+3000, 0)[0].Fleet
		for _, v := range []BucketView{view(whole(5000), "other"), nil} {
			if got := ls.Asks(&b, v, leaseT0+3000, 0)[0].Fleet; got != before {
				t.Fatalf("Fleet moved from %v to %v on a view it should not read", before, got)
			}
		}
	})
}

// Wants sizes a grant for a store that decides and grants in one step,
// from the bucket as this replica last saw it.
func TestLeasesWants(t *testing.T) {
	l := testLimit("rpm", 100, 100)
	b := leaseOn("k", l)
	full := func(config string, expires int64) *testView {
		return &testView{states: map[string]bucket.State{"rpm": {Tokens: l.Burst, Clock: leaseT0}}, config: config, expires: expires}
	}
	nearlyEmpty := &testView{states: map[string]bucket.State{"rpm": {Tokens: whole(2), Clock: leaseT0 + 100}}, config: b.FP}
	wantsRTT := func(view BucketView, rtt int64) []int64 {
		ls, _ := newTestLeases()
		ls.Spend([]LeaseBucket[string]{b}, 1, leaseT0+100, 0, true)
		ls.Credit(&b, nil, view, nil, leaseT0+100)
		return ls.Wants(&b, []int64{whole(1)}, leaseT0+100, rtt)
	}
	wants := func(view BucketView) []int64 { return wantsRTT(view, 20) }
	unseen := wants(nil)
	if len(unseen) != 1 || unseen[0] <= 0 || unseen[0]%bucket.Milli != 0 || unseen[0] > l.Burst {
		t.Fatalf("Wants on a bucket never seen = %v, want a positive grant in whole tokens within the burst", unseen)
	}
	// A bucket never seen is sized as a full one: the store grants no
	// more than it holds.
	for name, v := range map[string]BucketView{
		"seen full":               full(b.FP, 0),
		"seen, expired":           full(b.FP, leaseT0+100),
		"seen under other limits": full("other", 0),
	} {
		if got := wants(v); !slices.Equal(got, unseen) {
			t.Errorf("%s: Wants = %v, want %v as for a bucket never seen", name, got, unseen)
		}
	}
	// Two tokens, one of them paying the call: half of the other is
	// less than a token, with a round trip known or not (the other half
	// is for the other replicas' writes).
	if got := wantsRTT(nearlyEmpty, 0); !slices.Equal(got, []int64{0}) {
		t.Errorf("Wants near the limit = %v, want [0]", got)
	}
	if got := wants(nearlyEmpty); !slices.Equal(got, []int64{0}) {
		t.Errorf("Wants near the limit, 20 ms away = %v, want [0]", got)
	}
	ls, _ := newTestLeases()
	ls.Credit(&b, []int64{whole(5)}, nil, nil, leaseT0)
	moved := leaseOn("k", testLimit("rpm", 100, 200))
	if got := ls.Wants(&moved, []int64{whole(1)}, leaseT0+1, 20); got != nil {
		t.Errorf("Wants under limits the lease does not hold = %v, want nil", got)
	}
}

// Short tells a bucket at its limit from one far from it, as last seen.
func TestLeasesShort(t *testing.T) {
	l := testLimit("rpm", 100, 100)
	b := leaseOn("k", l)
	bs := []LeaseBucket[string]{b}
	cases := []struct {
		name string
		view BucketView
		rtt  int64
		want bool
	}{
		{"empty", &testView{states: map[string]bucket.State{"rpm": {Clock: leaseT0 + 100}}, config: b.FP}, 50, true},
		{"full", &testView{states: map[string]bucket.State{"rpm": {Tokens: l.Burst, Clock: leaseT0 + 100}}, config: b.FP}, 50, false},
		{"empty, no round trip known", &testView{states: map[string]bucket.State{"rpm": {Clock: leaseT0 + 100}}, config: b.FP}, 0, false},
		{"never seen", nil, 50, false},
		{"seen under other limits", &testView{states: map[string]bucket.State{"rpm": {Clock: leaseT0 + 100}}, config: "other"}, 50, false},
		{"seen, expired", &testView{states: map[string]bucket.State{"rpm": {Clock: leaseT0 + 100}}, config: b.FP, expires: leaseT0 + 100}, 50, false},
	}
	for _, c := range cases {
		ls, _ := newTestLeases()
		ls.Spend(bs, 1, leaseT0+100, 0, true)
		ls.Credit(&b, nil, c.view, nil, leaseT0+100)
		if got := ls.Short(bs, leaseT0+100, c.rtt); got != c.want {
			t.Errorf("%s: Short = %v, want %v", c.name, got, c.want)
		}
	}
}

// Cascades asked in both orders at once lock their leases in one order:
// no deadlock, and every token still accounted for.
func TestLeasesConcurrentCascades(t *testing.T) {
	ls, stats := newTestLeases()
	a, b := leaseOn("a", testLimit("rpm", 100, 100)), leaseOn("b", testLimit("tpm", 1000, 1000))
	orders := [][]LeaseBucket[string]{{a, b}, {b, a}}
	const calls = 20_000
	var spent [2]int64
	var offered int64
	start, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for g, bs := range orders {
			wg.Go(func() {
				<-start
				for i := range calls {
					if results, _, paid := ls.Spend(bs, 1, leaseT0+int64(i), 0, true); paid {
						for _, r := range results {
							spent[g] += r.Cost
						}
					}
				}
			})
		}
		wg.Go(func() {
			<-start
			for i := range calls / 10 {
				for _, x := range []LeaseBucket[string]{a, b} {
					ls.Credit(&x, []int64{whole(3)}, nil, nil, leaseT0+int64(i*10))
					offered += whole(3)
					ls.Idle(x.Key)
				}
			}
		})
		close(start)
		wg.Wait()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("cascades asked in opposite orders deadlocked")
	}
	held := sumMilli(ls.Peek(&a)) + sumMilli(ls.Peek(&b))
	if out := stats.LeaseOutstanding.Load(); out != held || offered != out+spent[0]+spent[1] {
		t.Fatalf("offered %d, spent %d, outstanding %d, held %d", offered, spent[0]+spent[1], out, held)
	}
}

var leasesSeed = flag.Uint64("leases.seed", 0, "run TestLeasesSimulation on this seed only")

// simLease is what the simulation expects of one holding: the spec the
// real one is held to after every step.
type simLease struct {
	fp        string
	names     []string
	tokens    []int64
	granted   []int64
	expires   int64
	used      int64
	grantedAt int64
	dry, busy bool
}

func (h *simLease) matches(b LeaseBucket[string]) bool {
	if h.fp != b.FP || len(h.names) != len(b.Res.Limits) {
		return false
	}
	for i, l := range b.Res.Limits {
		if h.names[i] != l.Name {
			return false
		}
	}
	return true
}

func (h *simLease) align(b LeaseBucket[string]) {
	n := len(b.Res.Limits)
	h.fp, h.names = b.FP, nil
	for _, l := range b.Res.Limits {
		h.names = append(h.names, l.Name)
	}
	h.tokens, h.granted, h.dry = make([]int64, n), make([]int64, n), false
}

func (h *simLease) held() int64 {
	var sum int64
	for _, v := range h.tokens {
		sum += v
	}
	return sum
}

// simModel is the simulation's expectation of a Leases, and its own
// count of what it handed in and what it got back.
type simModel struct {
	m map[string]*simLease
	// offered: tokens handed to Credit and Add; spent: what paid calls
	// cost; returned: withdrawn tokens a write gave back to the bucket;
	// inFlight: withdrawn tokens whose write has not settled.
	offered, spent, returned, inFlight int64
	// entryDropped: offered tokens that could not join their lease;
	// dropped: every token expected in LeaseDropped.
	entryDropped, dropped int64
}

func (m *simModel) getOrAdd(k string) *simLease {
	if m.m[k] == nil {
		m.m[k] = &simLease{}
	}
	return m.m[k]
}

// hold is Leases.hold: nil when the lease holds tokens under other limits.
func (m *simModel) hold(b LeaseBucket[string]) *simLease {
	h := m.getOrAdd(b.Key)
	if !h.matches(b) {
		if h.held() > 0 {
			return nil
		}
		h.align(b)
	}
	return h
}

func sumMilli(vs []int64) int64 {
	var s int64
	for _, v := range vs {
		s += v
	}
	return s
}

func (m *simModel) spend(bs []LeaseBucket[string], hits uint64, now int64, arriving bool) (paid bool, renew []string) {
	hs := make([]*simLease, len(bs))
	for i, b := range bs {
		if arriving {
			hs[i] = m.getOrAdd(b.Key)
		} else if hs[i] = m.m[b.Key]; hs[i] == nil {
			return false, nil
		}
	}
	if arriving {
		for i, b := range bs {
			if h := hs[i]; h.matches(b) || h.held() == 0 {
				if !h.matches(b) {
					h.align(b)
				}
				h.used = max(h.used, now)
			}
		}
	}
	for i, b := range bs {
		h := hs[i]
		ok := h.matches(b) && now < h.expires
		for j, l := range b.Res.Limits {
			ok = ok && h.tokens[j] >= max(bucket.Cost(l, hits), 1)
		}
		if !ok {
			if arriving {
				for i, h := range hs {
					if h.matches(bs[i]) {
						h.dry = true
					}
				}
			}
			return false, nil
		}
	}
	for i, b := range bs {
		h := hs[i]
		for j, l := range b.Res.Limits {
			h.tokens[j] -= bucket.Cost(l, hits)
		}
		h.used = now
		if h.busy {
			continue
		}
		for j := range h.tokens {
			if h.granted[j] > 0 && h.tokens[j] <= h.granted[j]/2 {
				h.busy = true
				renew = append(renew, b.Key)
				break
			}
		}
	}
	slices.Sort(renew)
	return true, renew
}

func (m *simModel) credit(b LeaseBucket[string], grant []int64, now int64) {
	sum := sumMilli(grant)
	m.offered += sum
	h := m.hold(b)
	if h == nil {
		m.entryDropped += sum
		m.dropped += sum
		return
	}
	if sum == 0 {
		return
	}
	for i, g := range grant {
		h.tokens[i] += g
		h.granted[i] = g
	}
	h.dry, h.grantedAt, h.expires, h.used = false, now, now+2*testHorizon, max(h.used, now)
}

func (m *simModel) add(b LeaseBucket[string], tokens []int64, now int64) {
	sum := sumMilli(tokens)
	m.offered += sum
	if sum == 0 {
		return
	}
	h := m.hold(b)
	if h == nil {
		m.entryDropped += sum
		m.dropped += sum
		return
	}
	for i, v := range tokens {
		h.tokens[i] += v
	}
	h.dry, h.expires, h.used = false, max(h.expires, now+2*testHorizon), max(h.used, now)
}

func (m *simModel) withdraw(b LeaseBucket[string]) []int64 {
	h := m.m[b.Key]
	if h == nil || h.held() == 0 {
		return nil
	}
	out := make([]int64, len(b.Res.Limits))
	for j, name := range h.names {
		if i := slices.IndexFunc(b.Res.Limits, func(l bucket.Limit) bool { return l.Name == name }); i >= 0 {
			out[i] = h.tokens[j]
		} else {
			m.dropped += h.tokens[j]
		}
		h.tokens[j] = 0
	}
	return out
}

func (m *simModel) restore(b LeaseBucket[string], tokens []int64) {
	if tokens == nil {
		return
	}
	h := m.hold(b)
	if h == nil {
		m.dropped += sumMilli(tokens)
		return
	}
	for i, v := range tokens {
		h.tokens[i] += v
	}
}

func (m *simModel) due(now int64) []string {
	var out []string
	for k, h := range m.m {
		switch {
		case h.busy:
		case h.held() > 0 && (now >= h.expires || now-h.used >= testHorizon):
			h.busy = true
			out = append(out, k)
		case h.held() == 0 && now-h.used >= 2*testHorizon:
			delete(m.m, k)
		}
	}
	slices.Sort(out)
	return out
}

func (m *simModel) outrun(bs []LeaseBucket[string], now int64) bool {
	for _, b := range bs {
		h := m.m[b.Key]
		if h != nil && h.busy && h.dry && now < h.expires && h.matches(b) &&
			slices.ContainsFunc(h.granted, func(g int64) bool { return g > 0 }) {
			return true
		}
	}
	return false
}

// TestLeasesSimulation runs random sequences of what a backend does with
// its leases, on a monotone clock, against a model of them, and checks
// after every step that no token is made or lost: each one handed in is
// held, spent, given back or counted dropped, exactly.
func TestLeasesSimulation(t *testing.T) {
	seeds, steps := []uint64{}, 1_000
	if *leasesSeed != 0 {
		seeds = append(seeds, *leasesSeed)
	} else {
		for s := range uint64(16) {
			seeds = append(seeds, s+1)
		}
	}
	if testing.Short() {
		seeds, steps = seeds[:min(len(seeds), 5)], 500
	}
	for _, seed := range seeds {
		simulateLeases(t, seed, steps)
		if t.Failed() {
			return
		}
	}
}

func simulateLeases(t *testing.T, seed uint64, steps int) {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	rpm, tpm := testLimit("rpm", 100, 100), testLimit("tpm", 1000, 2000)
	// Same names under new bursts, the same limits in another order,
	// limits added and removed: every way a lease can find its limits
	// changed.
	configs := [][]bucket.Limit{
		{rpm},
		{rpm, tpm},
		{tpm, rpm},
		{testLimit("rpm", 100, 200)},
		{perRequestLimit(testLimit("req", 50, 50)), tpm},
		{tpm},
	}
	keys := []string{"a", "b", "c"}
	cfg := map[string]int{}
	for _, k := range keys {
		cfg[k] = r.IntN(len(configs))
	}
	on := func(k string) LeaseBucket[string] { return leaseOn(k, configs[cfg[k]]...) }
	randKey := func() string { return keys[r.IntN(len(keys))] }
	randTokens := func(b LeaseBucket[string], most int64) []int64 {
		out := make([]int64, len(b.Res.Limits))
		for i := range out {
			if r.IntN(4) > 0 {
				out[i] = whole(r.Int64N(most + 1))
			}
		}
		return out
	}
	randView := func(b LeaseBucket[string], now int64) BucketView {
		if r.IntN(3) == 0 {
			return nil
		}
		v := &testView{states: map[string]bucket.State{}, config: b.FP}
		if r.IntN(5) == 0 {
			v.config = "other"
		}
		if r.IntN(5) == 0 {
			v.expires = now + r.Int64N(testHorizon)
		}
		for _, l := range b.Res.Limits {
			v.states[l.Name] = bucket.State{Tokens: r.Int64N(l.Burst + 1), Clock: now - r.Int64N(1000), Consumed: r.Int64N(whole(1_000_000))}
		}
		return v
	}

	ls, stats := newTestLeases()
	m := &simModel{m: map[string]*simLease{}}
	type folded struct {
		b      LeaseBucket[string]
		tokens []int64
	}
	var inFlight []folded
	now := leaseT0
	var log []string
	fail := func(step int, format string, args ...any) {
		t.Helper()
		tail := log[max(len(log)-12, 0):]
		t.Fatalf("seed %d (rerun: go test ./backend -run TestLeasesSimulation -leases.seed=%d), step %d: %s\nlast steps:\n  %s",
			seed, seed, step, fmt.Sprintf(format, args...), strings.Join(tail, "\n  "))
	}

	for step := range steps {
		switch n := r.IntN(100); {
		case n < 65:
			now += r.Int64N(50)
		case n < 90:
			now += r.Int64N(testHorizon / 2)
		case n < 95:
			now += r.Int64N(3 * testHorizon)
		default:
			// To the very ms a lease expires or turns idle or
			// forgettable, where an off-by-one would show.
			var edges []int64
			for _, h := range m.m {
				for _, e := range []int64{h.expires, h.used + testHorizon, h.used + 2*testHorizon} {
					if e > now {
						edges = append(edges, e)
					}
				}
			}
			if len(edges) > 0 {
				now = edges[r.IntN(len(edges))] - r.Int64N(2)
			}
		}
		if r.IntN(40) == 0 {
			// The operator changed a bucket's limits.
			k := randKey()
			cfg[k] = r.IntN(len(configs))
		}

		switch op := r.IntN(100); {
		case op < 35:
			bs := []LeaseBucket[string]{on(randKey())}
			if r.IntN(3) == 0 {
				other := keys[(slices.Index(keys, bs[0].Key)+1+r.IntN(len(keys)-1))%len(keys)]
				bs = append(bs, on(other))
			}
			hits := uint64(r.IntN(4))
			if r.IntN(10) == 0 {
				hits = uint64(1 + r.IntN(50))
			}
			arriving := r.IntN(5) > 0
			wantPaid, wantRenew := m.spend(bs, hits, now, arriving)
			results, renew, paid := ls.Spend(bs, hits, now, 0, arriving)
			log = append(log, fmt.Sprintf("%d: Spend(%v, %d hits, arriving %v) = paid %v renew %v", now-leaseT0, leaseKeys(bs), hits, arriving, paid, leaseKeys(renew)))
			if paid != wantPaid {
				fail(step, "Spend paid = %v, the model says %v", paid, wantPaid)
			}
			if got := leaseKeys(renew); !slices.Equal(got, wantRenew) {
				fail(step, "Spend renew = %v, the model says %v", got, wantRenew)
			}
			if !paid {
				if results != nil {
					fail(step, "unpaid, with results %+v", results)
				}
				break
			}
			var limits []bucket.Limit
			for _, b := range bs {
				limits = append(limits, b.Res.Limits...)
			}
			if len(results) != len(limits) {
				fail(step, "%d results for %d limits", len(results), len(limits))
			}
			for j, l := range limits {
				res, c := results[j], bucket.Cost(l, hits)
				if !res.Allowed || res.Cost != c || res.Tokens < 0 || res.Tokens > l.Burst-c {
					fail(step, "limit %s: result %+v for a cost of %d (burst %d)", l.Name, res, c, l.Burst)
				}
				m.spent += res.Cost
			}
		case op < 50:
			b := on(randKey())
			var grant []int64
			if r.IntN(4) > 0 {
				grant = randTokens(b, 20)
			}
			var written []bucket.State
			if r.IntN(2) == 0 {
				for range b.Res.Limits {
					written = append(written, bucket.State{Consumed: r.Int64N(whole(1_000_000))})
				}
			}
			log = append(log, fmt.Sprintf("%d: Credit(%s %v)", now-leaseT0, b.Key, grant))
			m.credit(b, grant, now)
			ls.Credit(&b, grant, randView(b, now), written, now)
		case op < 55:
			b := on(randKey())
			tokens := randTokens(b, 3)
			log = append(log, fmt.Sprintf("%d: Add(%s %v)", now-leaseT0, b.Key, tokens))
			m.add(b, tokens, now)
			ls.Add(&b, tokens, now)
		case op < 62:
			// A decision folds the lease into its write, which settles
			// now or some steps later.
			b := on(randKey())
			want := m.withdraw(b)
			got := ls.Withdraw(&b)
			log = append(log, fmt.Sprintf("%d: Withdraw(%s) = %v", now-leaseT0, b.Key, got))
			if !slices.Equal(got, want) || (got == nil) != (want == nil) {
				fail(step, "Withdraw = %v, the model says %v", got, want)
			}
			inFlight = append(inFlight, folded{b, got})
			m.inFlight += sumMilli(got)
			if r.IntN(2) == 0 {
				break
			}
			fallthrough
		case op < 67:
			// A write settles: lost for sure (Restore, perhaps into a
			// lease that meanwhile took tokens under other limits), of
			// unknown outcome (Drop), or landed, giving back what it
			// folded and maybe granting anew.
			if len(inFlight) == 0 {
				break
			}
			i := r.IntN(len(inFlight))
			f := inFlight[i]
			inFlight = slices.Delete(inFlight, i, i+1)
			m.inFlight -= sumMilli(f.tokens)
			outcome := r.IntN(3)
			log = append(log, fmt.Sprintf("%d: settle(%s %v), outcome %d", now-leaseT0, f.b.Key, f.tokens, outcome))
			switch outcome {
			case 0:
				m.restore(f.b, f.tokens)
				ls.Restore(&f.b, f.tokens)
			case 1:
				m.dropped += sumMilli(f.tokens)
				ls.Drop(f.tokens)
			default:
				m.returned += sumMilli(f.tokens)
				var grant []int64
				if r.IntN(2) == 0 {
					grant = randTokens(f.b, 20)
				}
				m.credit(f.b, grant, now)
				ls.Credit(&f.b, grant, randView(f.b, now), nil, now)
			}
		case op < 73:
			// The sweep: each lease due is given back, or its return
			// fails and it stays for the next sweep.
			want := m.due(now)
			due := ls.Due(now)
			log = append(log, fmt.Sprintf("%d: Due = %v", now-leaseT0, leaseKeys(due)))
			if got := leaseKeys(due); !slices.Equal(got, want) {
				fail(step, "Due = %v, the model says %v", got, want)
			}
			for _, b := range due {
				if r.IntN(4) > 0 {
					out := m.withdraw(b)
					if got := ls.Withdraw(&b); !slices.Equal(got, out) {
						fail(step, "Withdraw(%s) for its return = %v, the model says %v", b.Key, got, out)
					}
					m.returned += sumMilli(out)
					m.credit(b, nil, now)
					ls.Credit(&b, nil, nil, nil, now)
				}
				if h := m.m[b.Key]; h != nil {
					h.busy = false
				}
				ls.Idle(b.Key)
			}
		case op < 81:
			// A renewal finished (or a return failed).
			k := randKey()
			log = append(log, fmt.Sprintf("%d: Idle(%s)", now-leaseT0, k))
			if h := m.m[k]; h != nil {
				h.busy = false
			}
			ls.Idle(k)
		case op < 85:
			b := on(randKey())
			want := false
			if h := m.hold(b); h != nil && !h.busy {
				h.busy, want = true, true
			}
			got := ls.StartRenewal(&b)
			log = append(log, fmt.Sprintf("%d: StartRenewal(%s) = %v", now-leaseT0, b.Key, got))
			if got != want {
				fail(step, "StartRenewal(%s) = %v, the model says %v", b.Key, got, want)
			}
		case op < 92:
			b := on(randKey())
			h := m.hold(b)
			asks := ls.Asks(&b, randView(b, now), now, r.Int64N(100))
			log = append(log, fmt.Sprintf("%d: Asks(%s)", now-leaseT0, b.Key))
			if (asks == nil) != (h == nil) {
				fail(step, "Asks(%s) = %+v, the model expects a lease %v", b.Key, asks, h != nil)
			}
			for j, a := range asks {
				var grow int64
				if h.grantedAt > 0 && now-h.grantedAt < testHorizon/2 {
					grow = h.granted[j]
				}
				if a.Held != h.tokens[j] || a.Grow != grow || !(a.Own >= 0) || !(a.Fleet >= 0) || math.IsInf(a.Own, 0) {
					fail(step, "Asks(%s)[%d] = %+v, the model holds %d and grows %d", b.Key, j, a, h.tokens[j], grow)
				}
			}
		case op < 96:
			b := on(randKey())
			var want []int64
			if h := m.m[b.Key]; h != nil && h.matches(b) && h.held() > 0 {
				want = slices.Clone(h.tokens)
			}
			if got := ls.Peek(&b); !slices.Equal(got, want) || (got == nil) != (want == nil) {
				fail(step, "Peek(%s) = %v, the model says %v", b.Key, got, want)
			}
		case op < 99:
			bs := []LeaseBucket[string]{on(randKey()), on(randKey())}
			if got, want := ls.Outrun(bs, now), m.outrun(bs, now); got != want {
				fail(step, "Outrun(%v) = %v, the model says %v", leaseKeys(bs), got, want)
			}
		default:
			// Close: every lease is given back.
			all := ls.All()
			log = append(log, fmt.Sprintf("%d: All = %v", now-leaseT0, leaseKeys(all)))
			var want []string
			for k, h := range m.m {
				if h.held() > 0 {
					want = append(want, k)
				}
			}
			slices.Sort(want)
			if got := leaseKeys(all); !slices.Equal(got, want) {
				fail(step, "All = %v, the model says %v", got, want)
			}
			for _, b := range all {
				m.returned += sumMilli(m.withdraw(b))
				ls.Withdraw(&b)
				ls.Idle(b.Key)
				m.m[b.Key].busy = false
			}
		}

		checkLeases(t, ls, stats, m, func(format string, args ...any) { fail(step, format, args...) })
	}
}

// checkLeases holds ls to m: the same leases, holding the same tokens,
// never a negative one, and every token accounted for.
func checkLeases(t *testing.T, ls *Leases[string], stats *LeaseStats, m *simModel, fail func(string, ...any)) {
	t.Helper()
	ls.mu.Lock()
	var held int64
	var keys []string
	for k, h := range ls.m {
		keys = append(keys, k)
		h.mu.Lock()
		tokens, busy := slices.Clone(h.tokens), h.busy
		h.mu.Unlock()
		want := m.m[k]
		if want == nil {
			ls.mu.Unlock()
			fail("lease %s exists, the model has forgotten it", k)
			return
		}
		for _, v := range tokens {
			if v < 0 {
				ls.mu.Unlock()
				fail("lease %s holds %v: a negative count", k, tokens)
				return
			}
			held += v
		}
		if !slices.Equal(tokens, want.tokens) || busy != want.busy {
			ls.mu.Unlock()
			fail("lease %s holds %v (busy %v), the model %v (busy %v)", k, tokens, busy, want.tokens, want.busy)
			return
		}
	}
	ls.mu.Unlock()
	if len(keys) != len(m.m) {
		fail("leases %v, the model has %d", keys, len(m.m))
	}
	var busy bool
	for _, h := range m.m {
		busy = busy || h.busy
	}
	if ls.Busy() != busy {
		fail("Busy = %v, the model says %v", !busy, busy)
	}
	out := stats.LeaseOutstanding.Load()
	if out != held {
		fail("LeaseOutstanding = %d, the leases hold %d", out, held)
	}
	dropped, leased := int64(stats.LeaseDropped.Load()), int64(stats.Leased.Load())
	if m.offered != out+m.spent+dropped+m.returned+m.inFlight {
		fail("offered %d != outstanding %d + spent %d + dropped %d + returned %d + in flight %d (off by %d)",
			m.offered, out, m.spent, dropped, m.returned, m.inFlight, m.offered-(out+m.spent+dropped+m.returned+m.inFlight))
	}
	if leased != m.offered-m.entryDropped {
		fail("Leased = %d, want offered %d less %d dropped on the way in", leased, m.offered, m.entryDropped)
	}
	if dropped != m.dropped {
		fail("LeaseDropped = %d, the model says %d", dropped, m.dropped)
	}
}

// A charge its lease cannot pay whole takes what the lease holds, per
// limit, and leaves the store the rest: sent whole, it would leave the
// lease to pass checks while the bucket is in debt. A lease that holds
// nothing leaves the request as it was.
func TestChargingDrainsTheLease(t *testing.T) {
	rpm, tpm := perRequestLimit(testLimit("rpm", 100, 100)), testLimit("tpm", 1000, 1000)
	ls, _ := newTestLeases()
	b := leaseOn("k", rpm, tpm)
	ls.Credit(&b, []int64{whole(5), whole(30)}, nil, nil, leaseT0)
	bs := []LeaseBucket[string]{b}
	req := &Request{Hits: 50, Charge: true}
	if _, _, paid := ls.Spend(bs, 50, leaseT0, 0, true); paid {
		t.Fatal("a lease of 30 tokens paid a charge of 50")
	}
	got := ls.Charging(bs, req, leaseT0)
	if got == req || !slices.Equal(got.Paid, []int64{whole(1), whole(30)}) || req.Paid != nil {
		t.Fatalf("Charging paid %v (the caller's request now %v), want rpm's one and tpm's 30 in a copy", got.Paid, req.Paid)
	}
	if left := ls.Peek(&b); !slices.Equal(left, []int64{whole(4), 0}) {
		t.Errorf("the lease holds %v after the charge, want [4 0] (rpm's four requests left)", left)
	}
	if again := ls.Charging(bs, &Request{Hits: 50, Charge: true}, leaseT0); again.Paid != nil && again.Paid[1] != 0 {
		t.Errorf("a drained lease paid %v of a second charge", again.Paid)
	}
}
