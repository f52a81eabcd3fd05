package backendtest

import (
	"context"
	"maps"
	"testing"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/regions"
)

// GlobalClock is the regions' clock of MovingGlobal: 10 s windows, 1 s of
// skew, tokens held at most 500 ms.
func GlobalClock() regions.Clock { return regions.Clock{Window: 10_000, Skew: 1_000, Hold: 500} }

// MovingGlobal is the Global of a replica in eu-west-1, weighted 1 to
// us-east-1's 3 (a base of a quarter), with shares that move on
// GlobalClock.
func MovingGlobal(tb testing.TB) backend.Global {
	tb.Helper()
	g, err := FixedGlobal(tb, map[regions.Region]int64{"us-east-1": 3, "eu-west-1": 1}, "eu-west-1").Moving(GlobalClock())
	if err != nil {
		tb.Fatal(err)
	}
	return g
}

// FixedGlobal is the Global of a replica in region, global limits split
// between the regions by weights and never moved: each region enforces
// its weight's part of the limit.
func FixedGlobal(tb testing.TB, weights map[regions.Region]int64, region regions.Region) backend.Global {
	tb.Helper()
	split, err := regions.NewSplit(weights)
	if err != nil {
		tb.Fatal(err)
	}
	g, err := backend.NewGlobal(split, region)
	if err != nil {
		tb.Fatal(err)
	}
	return g
}

// ShareWorld is a backend with shares that move (MovingGlobal) and what
// ShareFollowsRecord needs of its store and clock.
type ShareWorld struct {
	Backend backend.Backend
	// Put writes entity's share record for resource api over version.
	Put func(entity string, rec regions.Record, version int64)
	// Now and Advance read and move the backend's clock (ms).
	Now     func() int64
	Advance func(ms int64)
	// Damage writes a share record for entity that does not decode.
	Damage func(entity string)
}

// ShareFollowsRecord runs the scenario every backend with moving shares
// must pass, from a clock in the middle of a slot: a key whose record
// lends the region a quarter more admits half of a 400/s limit's burst; a
// key with no record admits the base, a quarter; once the loan is given
// back and the replica's copy has aged past CacheFor, the first key
// admits the base's burst again; a record that does not decode fails the
// decision rather than enforce the base. w's backend has leases off, so
// the counts are exact.
func ShareFollowsRecord(t *testing.T, w ShareWorld) {
	t.Helper()
	clock := GlobalClock()
	m := clock.At(w.Now())
	if ms := w.Now() - clock.Start(m); ms < 3_000 || ms > 7_000 {
		t.Fatalf("the clock is %d ms into its slot; start it mid-slot, away from the edges InForce looks across", ms)
	}
	loan := regions.Loan{Made: m - 2, From: m - 1, To: m + 3, Parts: 250_000}
	w.Put("tenant-1", regions.Record{In: map[regions.Region]regions.Loans{"us-east-1": {loan}}}, 0)
	spec := bucket.Spec{Name: "rps", Rate: "400/s"}
	l, err := spec.Limit()
	if err != nil {
		t.Fatal(err)
	}
	decide := func(entity string) (backend.Decision, error) {
		return w.Backend.Decide(context.Background(), &backend.Request{Entity: entity, Resource: "api", Defaults: []bucket.Limit{l}, Hits: 1, Global: true})
	}
	admitted := func(entity string) int {
		n := 0
		for range 300 {
			d, err := decide(entity)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				n++
			}
		}
		return n
	}
	if got := admitted("tenant-1"); got != 200 {
		t.Errorf("with the loan: admitted %d, want 200 (the base and the loan)", got)
	}
	if got := admitted("tenant-2"); got != 100 {
		t.Errorf("no record: admitted %d, want 100 (the base)", got)
	}
	// A budget beside the rate keeps the region's base part whatever the
	// record lends: a month's tokens spent under a loan could not be
	// given back when the loan ends.
	month, err := bucket.Spec{Name: "month", Rate: "400", Period: "month"}.Limit()
	if err != nil {
		t.Fatal(err)
	}
	w.Put("tenant-4", regions.Record{In: map[regions.Region]regions.Loans{"us-east-1": {loan}}}, 0)
	budgeted := 0
	for range 300 {
		d, err := w.Backend.Decide(context.Background(), &backend.Request{Entity: "tenant-4", Resource: "api", Defaults: []bucket.Limit{l, month}, Hits: 1, Global: true})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			budgeted++
		}
	}
	if budgeted != 100 {
		t.Errorf("a month's budget of 400 beside the rate, under the loan: admitted %d, want 100 (the base's part of the budget)", budgeted)
	}
	loan.Back = m + 1
	w.Put("tenant-1", regions.Record{In: map[regions.Region]regions.Loans{"us-east-1": {loan}}}, 1)
	w.Advance(clock.Window) // the next slot, past CacheFor
	if got := admitted("tenant-1"); got != 100 {
		t.Errorf("after the loan went back: admitted %d, want 100 (the base's burst)", got)
	}
	w.Damage("tenant-3")
	if _, err := decide("tenant-3"); err == nil {
		t.Error("a decision on a damaged share record answered")
	}
}

// UsageWorld is two replicas with shares that move (MovingGlobal) on one
// region's store, and what UsageAddsUp needs of it.
type UsageWorld struct {
	Replicas [2]backend.Backend
	// Flush writes replica i's sums of the windows that are over.
	Flush func(i int) error
	// Usage reads the region's usage of slot, as a sync does.
	Usage func(slot regions.Slot) (map[regions.Key]int64, error)
	// Damage writes a usage entry of slot that does not decode.
	Damage  func(slot regions.Slot)
	Now     func() int64
	Advance func(ms int64)
}

// UsageAddsUp: what each replica was asked for each global key in a
// window, in parts of the limit, reaches the region's store once the
// window is over, summed over the replicas; requests of rules that are
// not global and refunds add nothing; a second flush adds nothing twice;
// usage that does not decode is an error, never a region asked for
// nothing.
func UsageAddsUp(t *testing.T, w UsageWorld) {
	t.Helper()
	clock := GlobalClock()
	m := clock.At(w.Now())
	l, err := (&bucket.Spec{Name: "rps", Rate: "400/s"}).Limit()
	if err != nil {
		t.Fatal(err)
	}
	ask := func(i int, entity string, hits uint64, n int, global, refund bool) {
		for range n {
			if _, err := w.Replicas[i].Decide(context.Background(), &backend.Request{Entity: entity, Resource: "api",
				Defaults: []bucket.Limit{l}, Hits: hits, Global: global, Refund: refund}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A hit of a 400/s limit over a 10 s window is 1/4000 of it: 250 parts.
	ask(0, "tenant-1", 1, 30, true, false)
	ask(1, "tenant-1", 1, 20, true, false)
	ask(1, "tenant-2", 4, 10, true, false)
	ask(0, "tenant-3", 1, 10, false, false)
	ask(0, "tenant-1", 1, 5, true, true)
	if got, err := w.Usage(m); err != nil || len(got) != 0 {
		t.Errorf("before the window is over: usage %v, %v; want none yet", got, err)
	}
	for i := range 2 {
		if err := w.Flush(i); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := w.Usage(m); err != nil || len(got) != 0 {
		t.Errorf("flushed while the window runs: usage %v, %v; want none yet", got, err)
	}
	w.Advance(clock.Start(m+1) + 1_000 - w.Now())
	ask(0, "tenant-1", 1, 8, true, false) // the next window's
	for range 2 {
		for i := range 2 {
			if err := w.Flush(i); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := map[regions.Key]int64{{Entity: "tenant-1", Resource: "api"}: 12_500, {Entity: "tenant-2", Resource: "api"}: 10_000}
	if got, err := w.Usage(m); err != nil || !maps.Equal(got, want) {
		t.Errorf("usage of the window: %v, %v; want %v", got, err, want)
	}
	if got, err := w.Usage(m + 1); err != nil || len(got) != 0 {
		t.Errorf("usage of the window under way: %v, %v; want none yet", got, err)
	}
	w.Damage(m)
	if got, err := w.Usage(m); err == nil {
		t.Errorf("damaged usage read as %v, want an error", got)
	}
}
