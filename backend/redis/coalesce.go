package redis

import (
	"context"
	"slices"
	"sync"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// batcher coalesces this replica's decisions into batches, per lane (on
// one Redis a single lane; on a Cluster one per hash tag, as a script may
// touch one slot only). A decision that finds its lane idle goes at once,
// in a run of its own, as it would alone. While a run is in flight, later
// decisions of its lane queue; when it returns, whoever ran it runs the
// queued ones (up to max) together in one run, each bucket's decided in
// arrival order, and so on while the queue refills. A replica's load then
// costs one round trip per batch however many callers and buckets it
// has, and Redis runs one script for all of them, which saves Redis most
// of its work per decision and the replica most of its system calls.
//
// The next batch goes out as soon as the last one is answered, from the
// goroutine that ran it: handing the lead to a waiting caller instead
// would put the next round trip behind every answered caller's work in
// the scheduler's queue, which under load is most of a round trip again.
//
// The mutex guards the map and the queues only; nobody holds it while
// waiting or talking to Redis, and a lane nobody is deciding on is
// dropped.
type batcher struct {
	mu sync.Mutex
	m  map[string]*waiters
	// max bounds the calls of one batch.
	max int
	// run decides a batch, fills in each call's answer and wakes the
	// followers.
	run func(batch []*pending)
}

// waiters are the calls of one lane waiting for the next run; the lane's
// presence in the map means a run is in flight.
type waiters struct{ queue []*pending }

// pending is one decision passing through the batcher. The answer's
// fields are written by whoever runs its batch, before it sends on wake,
// and read by the call's goroutine after.
type pending struct {
	ctx context.Context
	// buckets are the buckets the call is on, call what it costs them.
	buckets []scriptBucket
	call    scriptCall
	// Room for the buckets and costs of most calls (a bucket, or a
	// cascade's two, with a few limits), so that they come with the
	// pending's own allocation.
	bucketBuf [2]scriptBucket
	costBuf   [4]int64
	// follower: the call waits in a queue, and wake receives once its
	// answer is in.
	follower bool
	wake     chan struct{}

	// The answer.
	now     int64
	allowed bool
	after   []bucket.State
	granted []int64 // a lease call's grant, per limit
	cut     []int64 // what the burst cut off what it gave back
	kept    []int64 // what of its tokens the lease kept out on lease
	holds   []bool  // a charge's: whether each limit held its cost
	err     error
	// landed, when set, is called by the run with the answer in (and no
	// error), before the call is woken: the runs of a lane, and the
	// calls of a run, land in the order Redis decided them, so that what
	// each gave the leases is credited in that order (a renewal's grant
	// before the lease call Redis ran after it), whatever order their
	// callers wake in. held is what it leaves for the caller: what the
	// leases held once the run was credited, per limit (a lease call's).
	landed func(*pending)
	held   []int64
}

func newBatcher(max int, run func([]*pending)) *batcher {
	return &batcher{m: map[string]*waiters{}, max: max, run: run}
}

// do decides p, at once when its lane is idle, else in the lane's next
// batch, and returns by ctx's deadline at the latest. A call that gives up
// while its batch is in flight may still be charged by it (the bucket
// loses at most its tokens, never gains).
func (q *batcher) do(ctx context.Context, lane string, p *pending) error {
	q.mu.Lock()
	w, busy := q.m[lane]
	if !busy {
		q.m[lane] = &waiters{}
		q.mu.Unlock()
		q.run([]*pending{p})
		if batch := q.next(lane); batch != nil {
			// The callers queued meanwhile go on in a goroutine of
			// their own, so that this one answers now.
			go q.drain(lane, batch)
		}
		return p.err
	}
	p.follower, p.wake = true, make(chan struct{}, 1)
	w.queue = append(w.queue, p)
	q.mu.Unlock()
	select {
	case <-p.wake:
		return p.err
	case <-ctx.Done():
	}
	q.mu.Lock()
	if i := slices.Index(w.queue, p); i >= 0 {
		w.queue = slices.Delete(w.queue, i, i+1)
	}
	q.mu.Unlock()
	return ctx.Err()
}

// drain runs lane's batches, batch first, until nobody waits.
func (q *batcher) drain(lane string, batch []*pending) {
	for batch != nil {
		q.run(batch)
		batch = q.next(lane)
	}
}

// next takes the next batch of lane's waiting calls, or forgets the lane
// when nobody waits.
func (q *batcher) next(lane string) []*pending {
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.m[lane]
	if len(w.queue) == 0 {
		delete(q.m, lane)
		return nil
	}
	n := min(len(w.queue), q.max)
	batch := slices.Clone(w.queue[:n])
	w.queue = slices.Delete(w.queue, 0, n)
	return batch
}
