package redis

import (
	"context"
	"slices"
	"sync"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// batcher coalesces this replica's decisions on one bucket (or one
// cascade's pair of buckets) into batches: while a batch's script is in
// flight, later decisions for the same buckets and limits wait; when it
// returns, the waiting ones go together, the first of them leading, in
// one run of the script, decided in arrival order. A hot bucket then
// costs one round trip per batch however many callers it has, and Redis
// runs one script for all of them; a bucket nobody else is deciding on
// goes at once, as it would alone.
//
// The mutex guards the map and the queues only; nobody holds it while
// waiting or talking to Redis, and a group nobody is deciding on is
// dropped.
type batcher struct {
	mu sync.Mutex
	m  map[string]*waiters
	// max bounds the calls of one batch.
	max int
}

// waiters are the calls of one group waiting for its batch in flight;
// the group's presence in the map means a batch is in flight.
type waiters struct{ queue []*pending }

// pending is one decision passing through the batcher. The fields below
// wake are written by whoever hands the call over or answers it, before
// it sends on wake, and read by the call's goroutine after.
type pending struct {
	ctx  context.Context
	call scriptCall
	// wake receives once: the call leads a batch, or (follower) its
	// answer is in.
	wake chan struct{}

	batch    []*pending // when it leads: itself first, then its followers
	follower bool

	// The answer.
	now     int64
	allowed bool
	after   []bucket.State
	err     error
}

func newBatcher(max int) *batcher {
	return &batcher{m: map[string]*waiters{}, max: max}
}

// enter returns the batch p leads (itself first), at once when no batch
// of its group is in flight, else when the one in flight hands over. A
// nil batch and nil error mean another call's batch answered p; an error
// means ctx ended first, and p may or may not be charged by a batch that
// took it just then (the bucket loses at most its tokens, never gains).
func (q *batcher) enter(ctx context.Context, group string, p *pending) ([]*pending, error) {
	q.mu.Lock()
	w, busy := q.m[group]
	if !busy {
		q.m[group] = &waiters{}
		q.mu.Unlock()
		return []*pending{p}, nil
	}
	w.queue = append(w.queue, p)
	q.mu.Unlock()
	select {
	case <-p.wake:
		if p.follower {
			return nil, nil
		}
		return p.batch, nil
	case <-ctx.Done():
	}
	q.mu.Lock()
	if i := slices.Index(w.queue, p); i >= 0 {
		w.queue = slices.Delete(w.queue, i, i+1)
		q.mu.Unlock()
		return nil, ctx.Err()
	}
	follower := p.follower
	q.mu.Unlock()
	if follower {
		return nil, ctx.Err()
	}
	// Handed the lead just as ctx ended: the followers may have later
	// deadlines, so the batch still runs.
	<-p.wake
	return p.batch, nil
}

// leave hands group's waiting calls, as one batch, to the first of them,
// or forgets the group when nobody waits.
func (q *batcher) leave(group string) {
	q.mu.Lock()
	w := q.m[group]
	if len(w.queue) == 0 {
		delete(q.m, group)
		q.mu.Unlock()
		return
	}
	n := min(len(w.queue), q.max)
	head := w.queue[0]
	head.batch = slices.Clone(w.queue[:n])
	for _, f := range head.batch[1:] {
		f.follower = true
	}
	w.queue = slices.Delete(w.queue, 0, n)
	q.mu.Unlock()
	head.wake <- struct{}{}
}
