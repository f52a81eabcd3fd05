package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// slowWrites makes every bucket write take at least delay, like a far
// away or busy table, so that callers of a hot bucket pile up behind it.
type slowWrites struct {
	API
	delay time.Duration
}

func (s slowWrites) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	time.Sleep(s.delay)
	return s.API.UpdateItem(ctx, in, o...)
}

func (s slowWrites) PutItem(ctx context.Context, in *dynamodb.PutItemInput, o ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	time.Sleep(s.delay)
	return s.API.PutItem(ctx, in, o...)
}

func writeCalls(b *Backend) uint64 {
	calls, _ := b.Stats().Calls()
	return calls["UpdateItem"] + calls["PutItem"] + calls["TransactWriteItems"]
}

// decideAll runs one decision per request concurrently (the first one
// alone, so that the others queue behind its write) and returns the
// decisions in request order.
func decideAll(t *testing.T, b *Backend, reqs []backend.Request) []backend.Decision {
	t.Helper()
	out := make([]backend.Decision, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Go(func() {
			out[i], errs[i] = b.Decide(context.Background(), &reqs[i])
		})
		if i == 0 {
			time.Sleep(20 * time.Millisecond) // let it take the lane
		}
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
	}
	return out
}

// Callers that queue behind a write for their bucket are decided
// together and written as one UpdateItem, yet each gets its own answer:
// exactly the burst is admitted, the admitted ones see every remaining
// count from burst-1 down to 0 once, and the others are denied. With
// sharing off, every admitted decision writes on its own.
func TestCoalescedDecisionsAreIndividuallyCorrect(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maxBatch int
		writes   uint64
	}{
		{"coalesced", 0, 2}, // the create, then one write for the batch
		{"one by one", 1, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			// Leases off: a lease would pay some of the queued calls
			// with no write at all (TestQueuedCallsPaidByTheLease).
			b := e.replica(t, Options{MaxBatch: tc.maxBatch, LeaseHorizon: -1}, slowWrites{e.client, 100 * time.Millisecond})
			req := backend.Request{Entity: "e", Resource: "r", Defaults: []bucket.Limit{lim(t, "x", "1/hour", 10)}, Hits: 1}
			reqs := make([]backend.Request, 30)
			for i := range reqs {
				reqs[i] = req
			}
			var remaining []int64
			denied := 0
			for _, d := range decideAll(t, b, reqs) {
				r := d.Results[d.Binding]
				if !d.Allowed {
					denied++
					if r.Tokens != 0 {
						t.Errorf("denied with %d millitokens left", r.Tokens)
					}
					continue
				}
				remaining = append(remaining, r.Tokens/bucket.Milli)
			}
			slices.Sort(remaining)
			if want := []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}; !slices.Equal(remaining, want) || denied != 20 {
				t.Fatalf("admitted with remaining %v and denied %d; want %v and 20", remaining, denied, want)
			}
			if got := writeCalls(b); got != tc.writes {
				t.Errorf("%d writes, want %d", got, tc.writes)
			}
			if tc.maxBatch == 0 && b.Stats().Coalesced.Load() != 8 {
				t.Errorf("coalesced %d decisions, want 8 (9 admitted in one write)", b.Stats().Coalesced.Load())
			}
			item := e.rawItem(t, b.keys.EntityPK("e"), b.keys.BucketSK("r"))
			if tk, tc := attrN(t, item, "b_x_tk"), attrN(t, item, "b_x_tc"); tk != 0 || tc != 10*bucket.Milli {
				t.Fatalf("table holds tk %d tc %d, want 0 and %d", tk, tc, 10*bucket.Milli)
			}
		})
	}
}

// A batch decides its calls in arrival order, each against what the ones
// before it left: with 10 tokens, 4 + 4 pass, 4 does not, 2 does, and a
// check (0 hits) sees what is left without taking it: nothing, so it is
// denied (at zero a limit denies checks too).
func TestCoalescedBatchDecidesInOrder(t *testing.T) {
	e := newEnv(t)
	// Each write takes half a second: the five calls queue behind the
	// first one's within it, even on a busy machine. Leases off: with
	// them, the calls that queued are paid from the lease the first write
	// filled, and share no write (one CI run).
	b := e.replica(t, Options{LeaseHorizon: -1}, slowWrites{e.client, 500 * time.Millisecond})
	limits := []bucket.Limit{lim(t, "x", "1/hour", 11)}
	mk := func(entity string, hits uint64) backend.Request {
		return backend.Request{Entity: entity, Resource: "r", Defaults: limits, Hits: hits}
	}
	// The first takes 1 and holds the lane while the others queue in
	// order: each is started once the one before waits in the lane (a
	// fixed pause between them was not enough beside two busy loops,
	// where the second call overtook the first).
	reqs := []backend.Request{mk("e", 1)}
	for _, h := range []uint64{4, 4, 4, 2, 0} {
		reqs = append(reqs, mk("e", h))
	}
	out := make([]backend.Decision, len(reqs))
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Go(func() {
			d, err := b.Decide(context.Background(), &reqs[i])
			if err != nil {
				t.Error(err)
			}
			out[i] = d
		})
		if i == 0 {
			waitHeld(t, b.lanes, bucketKey{"e", "r"})
		} else {
			waitQueued(t, b.lanes, bucketKey{"e", "r"}, i)
		}
	}
	wg.Wait()
	want := []struct {
		allowed bool
		left    int64
	}{{true, 10}, {true, 6}, {true, 2}, {false, 2}, {true, 0}, {false, 0}}
	for i, w := range want {
		d := out[i]
		if d.Allowed != w.allowed || d.Results[0].Tokens != w.left*bucket.Milli {
			t.Errorf("call %d (hits %d): allowed %v with %d millitokens left, want %v and %d",
				i, reqs[i].Hits, d.Allowed, d.Results[0].Tokens, w.allowed, w.left*bucket.Milli)
		}
	}
	if got := writeCalls(b); got != 2 {
		t.Errorf("%d writes, want 2 (the create and one for the batch)", got)
	}
}

// The hot-key target of issue 7 in miniature: three replicas, 40 callers
// each on one bucket whose limit they do not reach, writes slowed to 5 ms.
// Coalescing keeps writes per admitted decision far below one, and the
// table's consumed total matches what was admitted, to the token.
func TestHotKeyWritesPerAdmittedDecision(t *testing.T) {
	e := newEnv(t)
	limits := []bucket.Limit{lim(t, "x", "1000000/s", 0)}
	var replicas []*Backend
	var admitted atomic.Int64
	deadline := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	for range 3 {
		b := e.replica(t, Options{LeaseHorizon: -1, Now: func() int64 { return time.Now().UnixMilli() }}, slowWrites{e.client, 5 * time.Millisecond})
		replicas = append(replicas, b)
		for range 40 {
			wg.Go(func() {
				req := backend.Request{Entity: "hot", Resource: "r", Defaults: limits, Hits: 1}
				for time.Now().Before(deadline) {
					d, err := b.Decide(context.Background(), &req)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	var writes uint64
	for _, b := range replicas {
		writes += writeCalls(b)
	}
	ratio := float64(writes) / float64(admitted.Load())
	t.Logf("admitted %d with %d writes: %.3f writes per admitted decision", admitted.Load(), writes, ratio)
	if ratio > 0.2 {
		t.Fatalf("%.3f writes per admitted decision, want at most 0.2", ratio)
	}
	item := e.rawItem(t, replicas[0].keys.EntityPK("hot"), replicas[0].keys.BucketSK("r"))
	if tc := attrN(t, item, "b_x_tc"); tc != admitted.Load()*bucket.Milli {
		t.Fatalf("table counts %d millitokens consumed, want %d", tc, admitted.Load()*bucket.Milli)
	}
}

// A request the last seen state cannot pay for is denied at once, from
// that state, even while a write for the bucket is in flight: it neither
// calls DynamoDB nor queues behind the write.
func TestDenialDoesNotQueueBehindAWrite(t *testing.T) {
	e := newEnv(t)
	b := e.replica(t, Options{}, slowWrites{e.client, 300 * time.Millisecond})
	req := backend.Request{Entity: "e", Resource: "r", Defaults: []bucket.Limit{lim(t, "x", "1/hour", 2)}, Hits: 2}
	mustDecide(t, b, req) // create, empty
	refund := req
	refund.Refund, refund.Hits = true, 1
	refunded := make(chan struct{})
	go func() {
		defer close(refunded)
		mustDecide(t, b, refund)
	}()
	time.Sleep(50 * time.Millisecond) // the refund holds the lane, writing
	calls0 := writeCalls(b)
	local0 := b.Stats().LocalAnswers.Load()
	if d := mustDecide(t, b, req); d.Allowed {
		t.Fatal("admitted from an empty bucket")
	}
	select {
	case <-refunded:
		t.Fatal("the denial waited for the write in flight")
	default:
	}
	if writeCalls(b) != calls0 || b.Stats().LocalAnswers.Load() != local0+1 {
		t.Fatalf("the denial made a call or was not counted as local: writes %d -> %d, local %d -> %d",
			calls0, writeCalls(b), local0, b.Stats().LocalAnswers.Load())
	}
	<-refunded
}

// With a negative MaxDenyStaleness (serve's --deny-staleness 0) every
// denial is confirmed by a read, even one right after this replica's own
// write.
func TestNegativeStalenessAlwaysAsks(t *testing.T) {
	e := newEnv(t)
	b := e.replica(t, Options{MaxDenyStaleness: -1})
	req := backend.Request{Entity: "e", Resource: "r", Defaults: []bucket.Limit{lim(t, "x", "1/hour", 1)}, Hits: 1}
	mustDecide(t, b, req)
	for i := 1; i <= 3; i++ {
		if mustDecide(t, b, req).Allowed {
			t.Fatal("admitted past the burst")
		}
		if calls, _ := b.Stats().Calls(); calls["GetItem"] != uint64(i) {
			t.Fatalf("after %d denials, %d reads; want one each", i, calls["GetItem"])
		}
	}
	if n := b.Stats().LocalAnswers.Load(); n != 0 {
		t.Fatalf("%d denials answered locally", n)
	}
}

// hungWrites is a table that takes bucket writes and never answers: each
// write returns only when its context ends.
type hungWrites struct{ API }

func (h hungWrites) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (h hungWrites) PutItem(ctx context.Context, in *dynamodb.PutItemInput, o ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A batch's leader answers its own caller at its own deadline, although
// the batch's write goes on for followers that can wait longer: a table
// that hangs must not make one caller late because later ones queued
// behind it. Each follower, too, gives up at its own deadline.
func TestBatchLeaderAnswersAtItsOwnDeadline(t *testing.T) {
	e := newEnv(t)
	b := e.replica(t, Options{}, hungWrites{e.client})
	req := backend.Request{Entity: "e", Resource: "r", Defaults: []bucket.Limit{lim(t, "x", "1/hour", 10)}, Hits: 1}
	// Read the bucket's config first, so that the calls below reach its
	// lane in the order they are made.
	warm, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := b.Decide(warm, &req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the write to a hung table: %v", err)
	}
	start := time.Now()
	// Each call's deadline, from start; the first holds the lane until
	// its own ends, and the other two queue behind it as one batch.
	deadlines := []time.Duration{300 * time.Millisecond, 600 * time.Millisecond, 3 * time.Second}
	took := make([]time.Duration, len(deadlines))
	errs := make([]error, len(deadlines))
	var wg sync.WaitGroup
	for i, d := range deadlines {
		wg.Go(func() {
			ctx, cancel := context.WithDeadline(context.Background(), start.Add(d))
			defer cancel()
			r := req
			_, errs[i] = b.Decide(ctx, &r)
			took[i] = time.Since(start)
		})
		time.Sleep(50 * time.Millisecond) // arrive in this order
	}
	wg.Wait()
	t.Logf("answered after %v: %v", took, errs)
	for i, d := range deadlines {
		if !errors.Is(errs[i], context.DeadlineExceeded) {
			t.Errorf("call %d: %v, want its deadline", i, errs[i])
		}
		// Generous for a busy machine, yet far from the next deadline.
		if took[i] > d+200*time.Millisecond {
			t.Errorf("call %d with a %v deadline answered after %v", i, d, took[i])
		}
	}
}

// unsteadyWrites is a table whose bucket writes are answered after a
// random time, and now and then never: the write itself reaches the table
// at once, as a request the network delivered whose answer is late or
// lost, and the caller waits for the answer or its context, whichever
// comes first. pending counts writes still on their way to the table.
type unsteadyWrites struct {
	API
	mu      sync.Mutex
	rng     *rand.Rand
	pending sync.WaitGroup
}

// delay is when the answer of a write comes, or false for never.
func (u *unsteadyWrites) delay() (time.Duration, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.rng.IntN(10) == 0 {
		return 0, false
	}
	return time.Duration(u.rng.IntN(150)) * time.Millisecond, true
}

func unsteady[T any](ctx context.Context, u *unsteadyWrites, write func(context.Context) (T, error)) (T, error) {
	type result struct {
		out T
		err error
	}
	done := make(chan result, 1)
	u.pending.Go(func() {
		out, err := write(context.WithoutCancel(ctx))
		done <- result{out, err}
	})
	var zero T
	d, answered := u.delay()
	if !answered {
		<-ctx.Done()
		return zero, ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return zero, ctx.Err()
	}
	select {
	case r := <-done:
		return r.out, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

func (u *unsteadyWrites) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	return unsteady(ctx, u, func(ctx context.Context) (*dynamodb.UpdateItemOutput, error) { return u.API.UpdateItem(ctx, in, o...) })
}

func (u *unsteadyWrites) PutItem(ctx context.Context, in *dynamodb.PutItemInput, o ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	return unsteady(ctx, u, func(ctx context.Context) (*dynamodb.PutItemOutput, error) { return u.API.PutItem(ctx, in, o...) })
}

// Callers with deadlines from 50 to 400 ms share three buckets on a table
// whose writes are slow, erratic and sometimes hung. Whatever batches
// they fall into, each is answered by its own deadline (plus scheduling
// slack), and each bucket's consumed total lies between what callers
// were admitted and that plus the calls that failed: a timed-out write
// may have landed, but nothing is counted twice or lost from an answer.
//
// With leases on, admissions paid from a lease leave the consumed total
// alone and tokens a lease took count in it though no caller spent them,
// so there only the lower bound holds: nothing is admitted that did not
// leave the bucket.
func TestEveryCallAnsweredByItsDeadline(t *testing.T) {
	for _, c := range []struct {
		name    string
		horizon time.Duration
	}{{"leases off", -1}, {"leases on", time.Second}} {
		t.Run(c.name, func(t *testing.T) { everyCallAnsweredByItsDeadline(t, c.horizon) })
	}
}

func everyCallAnsweredByItsDeadline(t *testing.T, horizon time.Duration) {
	e := newEnv(t)
	api := &unsteadyWrites{API: e.client, rng: rand.New(rand.NewPCG(1, 2))}
	b := e.replica(t, Options{LeaseHorizon: horizon, Now: func() int64 { return time.Now().UnixMilli() }}, api)
	limits := []bucket.Limit{lim(t, "x", "1000000/s", 0)}
	const slack = 100 * time.Millisecond // the race detector on a busy 2-core machine
	var mu sync.Mutex
	admitted, failed := map[string]int64{}, map[string]int64{}
	var late []string
	var wg sync.WaitGroup
	for g := range 24 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			for range 12 {
				entity := fmt.Sprintf("e%d", rng.IntN(3))
				budget := time.Duration(50+rng.IntN(350)) * time.Millisecond
				ctx, cancel := context.WithTimeout(context.Background(), budget)
				start := time.Now()
				d, err := b.Decide(ctx, &backend.Request{Entity: entity, Resource: "r", Defaults: limits, Hits: 1})
				took := time.Since(start)
				cancel()
				mu.Lock()
				switch {
				case took > budget+slack:
					late = append(late, fmt.Sprintf("%v with a %v deadline (%v)", took.Round(time.Millisecond), budget, err))
				case err != nil:
					failed[entity]++
				case d.Allowed:
					admitted[entity]++
				default:
					t.Errorf("denied under a limit nobody reaches")
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// Renewals and returns of leases write through api too, in the
	// background: Close ends them (and returns what it can) before the
	// writes api let run on are waited for; a write started after that
	// wait began would be a misuse of its WaitGroup (a data race).
	_ = b.Close() // a lease whose return hangs is lost, as in a crash: not this test's subject
	api.pending.Wait()
	for _, l := range late {
		t.Errorf("answered late: %s", l)
	}
	for i := range 3 {
		entity := fmt.Sprintf("e%d", i)
		item := e.rawItem(t, b.keys.EntityPK(entity), b.keys.BucketSK("r"))
		tc := attrN(t, item, "b_x_tc") / bucket.Milli
		t.Logf("%s: %d admitted, %d failed, %d consumed", entity, admitted[entity], failed[entity], tc)
		if tc < admitted[entity] || (horizon < 0 && tc > admitted[entity]+failed[entity]) {
			t.Errorf("%s consumed %d: %d admitted and %d failed", entity, tc, admitted[entity], failed[entity])
		}
	}
}

// Calls whose limits are one set in different orders share a batch; each
// answer still names the limit its remaining count belongs to, whatever
// order the batch's first call listed them in.
func TestCoalescedAnswersFollowTheirOwnLimits(t *testing.T) {
	e := newEnv(t)
	// Each write takes half a second: the five calls queue behind the
	// first one's within it, even on a busy machine. Leases off: with
	// them, the calls that queued are paid from the lease the first write
	// filled, and share no write (one CI run).
	b := e.replica(t, Options{LeaseHorizon: -1}, slowWrites{e.client, 500 * time.Millisecond})
	tight, roomy := lim(t, "tight", "1/hour", 10), lim(t, "roomy", "1/hour", 1000)
	xy := backend.Request{Entity: "e", Resource: "r", Defaults: []bucket.Limit{tight, roomy}, Hits: 1}
	yx := backend.Request{Entity: "e", Resource: "r", Defaults: []bucket.Limit{roomy, tight}, Hits: 1}
	reqs := []backend.Request{xy, yx, xy, yx, xy, yx}
	for i, d := range decideAll(t, b, reqs) {
		l, r := d.Limits[d.Binding], d.Results[d.Binding]
		if !d.Allowed || l.Name != "tight" || r.Tokens >= 10*bucket.Milli {
			t.Errorf("decision %d: allowed %v, binding %s with %d millitokens left; want tight, under 10 tokens", i, d.Allowed, l.Name, r.Tokens)
		}
	}
	if b.Stats().Coalesced.Load() == 0 {
		t.Fatal("no decisions shared a write: the test did not batch")
	}
}
