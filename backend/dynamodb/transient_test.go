package dynamodb

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/backendtest"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/regions"
)

// waitWrites waits until no write of b is in flight and its lanes are
// free, for a test that reads what the writes left.
func waitWrites(t *testing.T, b *Backend) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		b.lanes.mu.Lock()
		n := len(b.lanes.m)
		b.lanes.mu.Unlock()
		if n == 0 {
			waitBackground(t, b)
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a lane is still held after 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// A table slower than every caller's deadline (150 ms writes, 50 ms
// deadlines): the first callers on a key fail, by their deadline, but the
// write the first of them started lands anyway, and the tokens it took
// for the lease wait in the lease. The next callers are answered from it
// within their deadlines, with no write of their own. Only the first
// caller's token is lost (it left the bucket as spent, not as a lease,
// and a lease that spent it later could spend it on top of a bucket
// refilled meanwhile): on Close the bucket holds what was not admitted,
// less that token.
func TestAbandonedWriteWarmsTheKey(t *testing.T) {
	e := newEnv(t)
	b := e.replica(t, Options{}, slowWrites{e.client, 150 * time.Millisecond})
	req := backend.Request{Entity: "e", Resource: "r", Defaults: []bucket.Limit{lim(t, "x", "1/hour", 1000)}, Hits: 1}
	decideAllWithin := func(n int, budget time.Duration) (allowed int, errs []error, late int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), budget)
				defer cancel()
				start := time.Now()
				r := req
				d, err := b.Decide(ctx, &r)
				took := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				if took > budget+100*time.Millisecond {
					late++
				}
				if err != nil {
					errs = append(errs, err)
				} else if d.Allowed {
					allowed++
				}
			})
		}
		wg.Wait()
		return allowed, errs, late
	}

	// The bucket's config records are read once, by a read of its own
	// (recordcache): that is not this test's subject.
	if _, err := b.records.get(context.Background(), "e", "r"); err != nil {
		t.Fatal(err)
	}
	allowed, errs, late := decideAllWithin(10, 50*time.Millisecond)
	if allowed != 0 || len(errs) != 10 || late != 0 {
		t.Fatalf("first calls: %d allowed, %d late, errors %v; want every one to fail by its deadline", allowed, late, errs)
	}
	for _, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("first calls: %v, want their deadline", err)
		}
	}
	waitWrites(t, b)
	s := b.Stats()
	leased := s.LeaseOutstanding.Load()
	if leased < bucket.Milli {
		t.Fatalf("after the abandoned write the lease holds %d millitokens, want a grant", leased)
	}
	tc := attrN(t, e.rawItem(t, b.keys.EntityPK("e"), b.keys.BucketSK("r")), "b_x_tc")
	if tc != leased+bucket.Milli {
		t.Fatalf("the bucket counts %d millitokens taken, the lease holds %d: want the lease and the first caller's token", tc, leased)
	}

	writesBefore, localBefore := writes(b), s.LocalAnswers.Load()
	allowed, errs, late = decideAllWithin(10, 50*time.Millisecond)
	if allowed != 10 || len(errs) != 0 || late != 0 {
		t.Fatalf("calls after the write landed: %d of 10 allowed, %d late, errors %v", allowed, late, errs)
	}
	if n := s.LocalAnswers.Load() - localBefore; n != 10 {
		t.Errorf("%d of 10 answered from the lease", n)
	}
	t.Logf("lease %d millitokens after the abandoned write; %d writes before the second round, %d after", leased, writesBefore, writes(b))

	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if tk := e.tokensIn(t, b, "e", "r", "x"); tk != (1000-11)*bucket.Milli {
		t.Errorf("after Close the bucket holds %d millitokens, want %d (10 admitted, 1 lost with its caller)", tk, (1000-11)*bucket.Milli)
	}
}

// A key that turns hot from cold, 10 callers on one replica, 5 ms to the
// table: the lease follows demand as it arrives and at least doubles at
// each early renewal, so the key is warm after a handful of writes
// instead of a write per batch for a horizon.
func TestHotKeyFromColdWarmsInAFewWrites(t *testing.T) {
	e := newEnv(t)
	b := e.replica(t, Options{Now: func() int64 { return time.Now().UnixMilli() }}, slowWrites{e.client, 5 * time.Millisecond})
	req := backend.Request{Entity: "hot", Resource: "r", Defaults: []bucket.Limit{lim(t, "x", "1000000000/s", 0)}, Hits: 1}
	const callers, each = 10, 300
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range callers {
		wg.Go(func() {
			for range each {
				r := req
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				if d, err := b.Decide(ctx, &r); err != nil || !d.Allowed {
					failed.Add(1)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	w := writes(b)
	t.Logf("%d decisions from cold: %d writes, %d answered locally, %d leased", callers*each, w, b.Stats().LocalAnswers.Load(), b.Stats().Leased.Load())
	if failed.Load() != 0 {
		t.Fatalf("%d decisions failed or were denied under a limit nobody reaches", failed.Load())
	}
	// Doubling from a first lease of 30 tokens covers 3,000 decisions in
	// 7 grants; 2 to 4 measured. Leases sized by the horizon's average
	// from zero took 12 to 20, and 50 to 80 decisions waited for them.
	if w > 8 {
		t.Errorf("%d writes for %d decisions from cold, want at most 8", w, callers*each)
	}
	if waited := callers*each - int(b.Stats().LocalAnswers.Load()); waited > 30 {
		t.Errorf("%d of %d decisions from cold waited for a write, want at most 30", waited, callers*each)
	}
}

// A table farther than the callers' deadlines (70 ms writes, 40 ms left
// of Envoy's 50 for the backend, as the service leaves it), one key at
// its limit, three replicas with 30 callers each, after one unhurried
// call per replica. Before leases outlived their callers no call here
// was ever admitted (every write died with its caller, and Envoy failed
// open): now the fleet admits most of its bound and never more, and
// every call is answered in time, admitted or denied: a replica whose
// lease is spent, with its next grant on the way, denies what the lease
// cannot pay (issue 24: no errors for Envoy's failure mode to pass).
func TestFarTableAtTheLimit(t *testing.T) {
	e := newEnv(t)
	l := lim(t, "x", "500/s", 500)
	req := backend.Request{Entity: "far", Resource: "r", Defaults: []bucket.Limit{l}, Hits: 1}
	start := time.Now()
	_, ds := slowReplicas(t, e, 3, 70*time.Millisecond, req)
	goroutines := runtime.NumGoroutine()
	loadStart := time.Now()
	res := backendtest.Storm(ds, req, 30, 2*time.Second, 40*time.Millisecond, 50*time.Millisecond)
	elapsed := time.Since(start)
	peak := runtime.NumGoroutine()
	bound := float64(l.Burst)/bucket.Milli + 500*elapsed.Seconds() + 1
	got := float64(res.Admitted + 3) // the unhurried calls
	// A floor for what the load could have had, whatever the priming
	// took: the burst, the refill over the load itself and the priming
	// calls (leases taken while priming let some of its refill in too).
	reachable := float64(l.Burst)/bucket.Milli + 500*time.Since(loadStart).Seconds() + 3
	t.Logf("%v (+3 unhurried); bound %.0f over %v: %.3f of it, %.3f of the burst and the load's own refill (%.0f); goroutines %d before the load, %d after",
		res, bound, elapsed.Round(time.Millisecond), got/bound, got/reachable, reachable, goroutines, peak)
	// Each replica ends holding up to its part of two round trips of
	// refill, unspent, and the first round trip's calls find no lease
	// that covers them: 0.75 of the burst and the load's own refill is
	// an honest floor on a busy 2-core machine (0.94 to 1.04 measured,
	// with and without the race detector and two busy loops; 0.70 to
	// 0.83 of the bound, whose time includes the priming). Failed: none
	// (the code before this work failed 4,319 of 4,320; reading
	// the storm's pace before denying failed 0.1 to 1%, one call per
	// caller as the storm began). Late: 0 to 17, the machine's own
	// scheduling beside two busy loops.
	res.AtTheLimit(t, got, bound, reachable)
}

// Once the table is known to be farther than a call's deadline, the call
// does not queue for a write that cannot answer it in time: it is
// answered at once, for the failure policy, and a renewal in the
// background fills the lease, from which the next call is admitted.
func TestCallBeyondReachIsAnsweredAtOnce(t *testing.T) {
	e := newEnv(t)
	b := e.replica(t, Options{}, slowWrites{e.client, 150 * time.Millisecond})
	limits := []bucket.Limit{lim(t, "x", "1/hour", 1000)}
	// One unhurried call measures the round trip.
	mustDecide(t, b, backend.Request{Entity: "known", Resource: "r", Defaults: limits, Hits: 1})
	req := backend.Request{Entity: "new", Resource: "r", Defaults: limits, Hits: 1}
	if _, err := b.records.get(context.Background(), "new", "r"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := b.Decide(ctx, &req)
	took := time.Since(start)
	if !errors.Is(err, errBeyondReach) || !errors.Is(err, context.DeadlineExceeded) || took > 30*time.Millisecond {
		t.Fatalf("a call with 50 ms left, the table 150 ms away: %v after %v; want errBeyondReach at once", err, took)
	}
	waitWrites(t, b)
	if b.Stats().LeaseOutstanding.Load() == 0 {
		t.Fatal("no renewal filled the lease")
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if d, err := b.Decide(ctx2, &req); err != nil || !d.Allowed {
		t.Fatalf("the call after the renewal: %+v, %v", d, err)
	}
}

// slowReplicas starts n replicas on the wall clock whose writes each
// take delay more, and primes each with one unhurried call of req.
func slowReplicas(t *testing.T, e *env, n int, delay time.Duration, req backend.Request) ([]*Backend, []backendtest.Decider) {
	t.Helper()
	return slowReplicasWith(t, e, Options{}, n, delay, req)
}

// slowReplicasWith is slowReplicas with opts (Now is the wall clock).
func slowReplicasWith(t *testing.T, e *env, opts Options, n int, delay time.Duration, req backend.Request) ([]*Backend, []backendtest.Decider) {
	t.Helper()
	opts.Now = func() int64 { return time.Now().UnixMilli() }
	var replicas []*Backend
	var ds []backendtest.Decider
	for range n {
		b := e.replica(t, opts, slowWrites{e.client, delay})
		r := req
		if d, err := b.Decide(context.Background(), &r); err != nil || !d.Allowed {
			t.Fatalf("unhurried first call: %+v, %v", d, err)
		}
		replicas, ds = append(replicas, b), append(ds, b)
	}
	return replicas, ds
}

// A table near enough for every deadline (20 ms writes, 50 ms deadlines)
// but a key at its limit, asked far more than it holds by 20 callers on
// two replicas: a call its lease cannot pay, while this replica's last
// write left the bucket unable to pay one more hit and the lease's next
// grant is on its way, is denied from memory, as a quota client's spent
// assignment denies. It does not queue behind the write in flight
// and the one after it, which would outlast its deadline and leave it to
// the failure policy (Envoy's fail-open admits it: over the limit,
// uncounted). The refill meanwhile goes to the leases the writes bring,
// for the calls after them; each write leaves room in the bucket for the
// other replica's, so neither starves the other by winning every race.
func TestSlowTableAtTheLimitDeniesFromMemory(t *testing.T) {
	e := newEnv(t)
	l := lim(t, "x", "500/s", 500)
	req := backend.Request{Entity: "slow", Resource: "r", Defaults: []bucket.Limit{l}, Hits: 1}
	start := time.Now()
	replicas, ds := slowReplicas(t, e, 2, 20*time.Millisecond, req)
	loadStart := time.Now()
	// The burst goes first, while the callers' first calls queue for the
	// writes that warm the key (a cold key's transient, on a table where
	// two writes outlast a deadline); what is measured is the limit.
	warm := backendtest.Storm(ds, req, 10, 500*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond)
	res := backendtest.Storm(ds, req, 10, 2*time.Second, 50*time.Millisecond, 50*time.Millisecond)
	elapsed := time.Since(start)
	var local, deadline, writes, retries uint64
	for _, b := range replicas {
		local += b.Stats().LocalAnswers.Load()
		deadline += b.Stats().DeadlineDenials.Load()
		writes += writeCalls(b)
		retries += b.Stats().ConditionRetries.Load()
	}
	bound := float64(l.Burst)/bucket.Milli + 500*elapsed.Seconds() + 1
	got := float64(warm.Admitted + res.Admitted + 2)
	reachable := float64(l.Burst)/bucket.Milli + 500*time.Since(loadStart).Seconds() + 2
	t.Logf("warm-up: %v", warm)
	t.Logf("%v (+2 unhurried, +%d warming); bound %.0f: %.3f of it, %.3f of the burst and the load's refill; %d answered from memory, %d at their deadline, %d writes, %d lost races",
		res, warm.Admitted, bound, got/bound, got/reachable, local, deadline, writes, retries)
	res.AtTheLimit(t, got, bound, reachable)
	// Before, a third to a half of the calls took more than half their
	// budget, and 8 to 17% failed at it (waiting behind a write, or in a
	// write that lost its races to the other replica's); none does now.
	if res.Waited > res.Total()/50 {
		t.Errorf("%d of %d calls took more than half their budget, want at most 2%%", res.Waited, res.Total())
	}
}

// Two replicas asked half again what a key's limit gives (150 calls a
// second on 100/s), at an even pace, 5 ms from their table: the key
// lives off its refill, and its calls are answered from memory, paid
// from the lease each renewal brings or denied while the next is on its
// way. Before, a call that found the lease spent and no renewal under way
// wrote for itself: most calls waited for a write (p50 10 ms, p99 51 ms),
// a third of the writes lost their race to the other replica's, and some
// calls failed at their deadline; the fleet wrote more often than it
// admitted.
func TestAtTheLimitCallsDoNotWaitForTheTable(t *testing.T) {
	e := newEnv(t)
	l := lim(t, "x", "100/s", 100)
	req := backend.Request{Entity: "paced", Resource: "r", Defaults: []bucket.Limit{l}, Hits: 1}
	const delay = 5 * time.Millisecond
	replicas, ds := slowReplicas(t, e, 2, delay, req)
	backendtest.Paced(ds, req, 150, time.Second, 50*time.Millisecond) // the burst goes
	var writes0, lost0 uint64
	for _, b := range replicas {
		writes0 += writeCalls(b)
		lost0 += b.Stats().ConditionRetries.Load()
	}
	start := time.Now()
	res := backendtest.Paced(ds, req, 150, 4*time.Second, 50*time.Millisecond)
	elapsed := time.Since(start)
	var writes, lost uint64
	for _, b := range replicas {
		writes += writeCalls(b)
		lost += b.Stats().ConditionRetries.Load()
	}
	writes, lost = writes-writes0, lost-lost0
	t.Logf("%v; %d writes, %d lost races", res, writes, lost)
	// The burst was spent in the first second; what is left to admit is
	// the refill, plus what the leases held then.
	if bound := 100*elapsed.Seconds() + 100; float64(res.Admitted) > bound {
		t.Errorf("admitted %d, over the refill and the burst, %.0f", res.Admitted, bound)
	}
	if float64(res.Admitted) < 0.8*100*elapsed.Seconds() {
		t.Errorf("admitted %d in %v, under 0.8 of the refill", res.Admitted, elapsed)
	}
	if res.Failed > 0 {
		t.Errorf("%d calls failed (first: %s), want none", res.Failed, res.FirstErr)
	}
	// Every write takes the delay; a call that waited for one took longer.
	if n := res.Over(delay); n > len(res.Took)/20 {
		t.Errorf("%d of %d calls took longer than a write, want at most 5%%", n, len(res.Took))
	}
	if writes > uint64(res.Admitted)*5/4 {
		t.Errorf("%d writes for %d admissions: the replicas wrote for single calls", writes, res.Admitted)
	}
}

// A region's only replica at its part of a global limit (200/s split
// 1:1, so 100/s here), 5 ms from its table, asked 1,000 calls a second:
// a call its lease cannot pay while the renewal is on its way is denied
// from memory, as on a bucket other replicas write, however long that
// renewal takes. A region's part is a share of a limit the regions hold
// together, not one bucket whose answers a lone replica must give
// exactly (a lone replica on a bucket of its own still decides there by
// the table: TestLeaseMatchesOneBucketWhileItRefills). Before, such
// calls queued for the table, one write after another: in the in-region
// world (regions/syncer TestRegionsDecideInRegion) the heavy region's
// p99 was 37 to 79 ms in 19 of 21 windows. TestLeasesAtLimit holds the
// rule itself; this holds what it buys at the store, with margins for a
// busy machine. Beside two other test processes: no call past half its
// budget in three runs, 12 of 2,091 in one under the race detector;
// without either part of the rule, 4, 8 and 14 of about 2,300 in three
// runs, slowest calls 31 to 51 ms.
func TestRegionAtItsPartsLimitDoesNotWaitForTheTable(t *testing.T) {
	g := backendtest.FixedGlobal(t, map[regions.Region]int64{"us-east-1": 1, "eu-west-1": 1}, "us-east-1")
	const delay = 5 * time.Millisecond
	e := newEnv(t)
	req := backend.Request{Entity: "paced", Resource: "r", Defaults: []bucket.Limit{lim(t, "x", "200/s", 100)}, Hits: 1, Global: true}
	replicas, ds := slowReplicasWith(t, e, Options{Global: g}, 1, delay, req)
	backendtest.Paced(ds, req, 1000, time.Second, 50*time.Millisecond) // the burst goes
	writes0 := writeCalls(replicas[0])
	start := time.Now()
	res := backendtest.Paced(ds, req, 1000, 3*time.Second, 50*time.Millisecond)
	elapsed := time.Since(start)
	writes := writeCalls(replicas[0]) - writes0
	slow := res.Over(delay)
	t.Logf("%v; %d writes, %d of %d calls took longer than a write", res, writes, slow, len(res.Took))
	// 100 a second is the part: what is left to admit is its refill,
	// plus what the lease held then (at most the part's burst).
	if bound := 100*elapsed.Seconds() + 50; float64(res.Admitted) > bound {
		t.Errorf("admitted %d, over the part's refill and burst, %.0f", res.Admitted, bound)
	}
	if float64(res.Admitted) < 0.8*100*elapsed.Seconds() {
		t.Errorf("admitted %d in %v, under 0.8 of the part's refill", res.Admitted, elapsed)
	}
	if res.Failed > 0 {
		t.Errorf("%d calls failed (first: %s), want none", res.Failed, res.FirstErr)
	}
	if slow > len(res.Took)/20 {
		t.Errorf("%d of %d calls took longer than a write, want at most 5%%", slow, len(res.Took))
	}
	if res.Waited > int64(len(res.Took)/100) {
		t.Errorf("%d of %d calls waited past half their budget, want at most 1%%", res.Waited, len(res.Took))
	}
}

// limitsFrom decides with the limits lim holds at the call's start, as a
// replica whose global share moves, or whose records an operator edits,
// sees its limits change under a busy key.
type limitsFrom struct {
	b   *Backend
	lim *atomic.Pointer[bucket.Limit]
}

func (f limitsFrom) Decide(ctx context.Context, req *backend.Request) (backend.Decision, error) {
	req.Defaults = []bucket.Limit{*f.lim.Load()}
	return f.b.Decide(ctx, req)
}

// Two replicas at a key's limit (800 calls a second at an even pace), 5
// ms from their table, while its limit moves between 300/s and 500/s
// every half second, as a region's share does when demand moves (a
// region's moves once in a sync window at most): at most one call fails
// for each change. Before, a batch of calls planned
// on the old limits kept rewriting the bucket back to them, losing to
// every write of the replica on the new ones, and the calls behind it
// waited out their deadlines for the lane: 23 to 41 calls failed in
// eight changes, in bursts of up to 300 ms. Now such a batch's calls
// resolve their limits again; a batch that loses its race twice near the
// limit is denied at once, leaving the refill to the leases' writes; and
// a lease drained under the old limits denies from memory while the
// renewal that folds it and claims under the new ones is on its way.
func TestChangingLimitsAtTheLimit(t *testing.T) {
	e := newEnv(t)
	lo, hi := lim(t, "x", "300/s", 300), lim(t, "x", "500/s", 500)
	var cur atomic.Pointer[bucket.Limit]
	cur.Store(&lo)
	req := backend.Request{Entity: "moving", Resource: "r", Defaults: []bucket.Limit{lo}, Hits: 1}
	replicas, _ := slowReplicas(t, e, 2, 5*time.Millisecond, req)
	var ds []backendtest.Decider
	for _, b := range replicas {
		ds = append(ds, limitsFrom{b, &cur})
	}
	backendtest.Paced(ds, req, 800, time.Second, 50*time.Millisecond) // the burst goes
	stop := make(chan struct{})
	moved := make(chan struct{})
	go func() {
		defer close(moved)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
			if i%2 == 0 {
				cur.Store(&hi)
			} else {
				cur.Store(&lo)
			}
		}
	}()
	start := time.Now()
	// Calls have 100 ms: the failures this test is about were bursts of
	// up to 300 ms, while a busy machine's scheduling alone can hold a
	// call past 50 ms.
	res := backendtest.Paced(ds, req, 800, 4*time.Second, 100*time.Millisecond)
	elapsed := time.Since(start)
	close(stop)
	<-moved
	t.Logf("%v", res)
	// A change of limits still costs a write or two under the new ones,
	// and a call may meet it late in its budget: at most one failure for
	// each change, on a machine as busy as CI's.
	if changes := int64(elapsed / (500 * time.Millisecond)); res.Failed > changes {
		t.Errorf("%d of %d calls failed (first: %s) in %d changes of limits, want at most one a change", res.Failed, res.Total(), res.FirstErr, changes)
	}
	if bound := 500*elapsed.Seconds() + 500; float64(res.Admitted) > bound {
		t.Errorf("admitted %d, over the higher limit's refill and burst, %.0f", res.Admitted, bound)
	}
	if low := 0.8 * 300 * elapsed.Seconds(); float64(res.Admitted) < low {
		t.Errorf("admitted %d, under 0.8 of the lower limit's refill, %.0f", res.Admitted, low)
	}
}
