package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// lanes queue the decisions of each bucket on this replica, so that one
// batch per bucket talks to DynamoDB at a time. Decisions that arrive
// while a batch is in flight wait; when it is done, the waiting decisions
// that can share a write are handed over together to the first of them,
// which decides them in arrival order against the state the last write
// returned and writes them as one conditional write. Every call,
// leader or follower, is answered by its own deadline at the latest: the
// batch's write goes on while any of its calls still waits (see
// Backend.lead).
//
// Without this, every caller of a hot bucket would race every other for
// each token: all but one of their conditional writes would fail, and
// each success would cost a write. Queued, a replica writes a hot bucket
// once per round trip to DynamoDB whatever the number of callers.
//
// There is no lock across buckets while anyone waits or writes: the mutex
// only guards the map and the queues, and a lane nobody holds or waits
// for is dropped.
type lanes struct {
	mu sync.Mutex
	m  map[bucketKey]*lane
	// maxBatch bounds the calls decided together; 1 turns sharing off.
	maxBatch int
}

// lane is one bucket's queue.
type lane struct {
	busy  bool    // a batch (or a cascade) holds the bucket
	queue []*call // waiting, in arrival order
}

// call is one decision passing through a lane. The fields below wake are
// written by whoever hands the call over (under lanes.mu) or answers it,
// before it sends on wake, and read by the call's own goroutine after.
type call struct {
	ctx context.Context
	req *backend.Request
	// group says which calls may be decided and written together: those
	// of one bucket whose limits resolved alike. "" never shares (a
	// cascade, which holds two lanes).
	group string
	// guessed: the call was resolved on a guess of its records
	// (Backend.guess), not yet confirmed.
	guessed bool
	// kind says what the call asks: a decision, or a lease's renewal or
	// return, which the lane orders among the bucket's decisions.
	kind callKind
	// wake receives once per hand-over: the lane was handed to the call,
	// or its answer is in (a follower's, or a leader's whose batch runs
	// detached).
	wake chan struct{}
	// state is the hand-shake between the batch that answers the call
	// and the caller that may stop waiting first (callPending,
	// callAnswered, callAbandoned): whichever moves it first decides
	// whether the caller takes the answer.
	state atomic.Int32

	batch []*call // when the lane is handed to it: itself first, then its followers
	// follower: the call is decided and answered by another's batch.
	follower bool

	// The answer.
	results []bucket.Result
	// limits are what results line up with: the limits of the batch's
	// first call, which a follower may list in another order.
	limits  []bucket.Limit
	allowed bool
	err     error
	done    bool // answered (by a batch, or by the leader giving up)
}

const (
	callPending int32 = iota
	callAnswered
	callAbandoned
)

// callKind is what a call through a lane asks for.
type callKind int

const (
	// decide: a decision on a request (the zero kind).
	decide callKind = iota
	// renewal: more tokens for this replica's lease on the bucket.
	renewal
	// giveBack: the lease's tokens back to the bucket.
	giveBack
)

// finish marks c answered and wakes its caller at once, so that a call
// decided early does not wait for the rest of its batch. c must not be
// written to after. It reports false when the caller had stopped waiting
// (abandon): what the batch did for the call is then the batch's to
// settle. A second finish changes nothing.
func (c *call) finish() bool {
	c.done = true
	if c.state.CompareAndSwap(callPending, callAnswered) {
		// Room is certain: the lane's hand-over, the only other send,
		// was received before the call could be in a batch.
		c.wake <- struct{}{}
		return true
	}
	return c.state.Load() == callAnswered
}

// deny turns c's answer into a denial on every limit, each with the time
// its cost takes to refill as the wait.
func (c *call) deny() {
	c.allowed = false
	for j, l := range c.limits {
		r := &c.results[j]
		r.Allowed = false
		if r.Wait = bucket.FillTime(l, r.Cost); r.Wait <= 0 {
			r.Wait = bucket.Never
		}
	}
}

// gone reports whether c's caller has stopped waiting or is about to
// (its context ended), and if so answers c with that error: a batch
// passes over such a call.
func (c *call) gone() bool {
	err := c.ctx.Err()
	if err == nil {
		return false
	}
	c.err = fmt.Errorf("bucket %q/%q: %w", c.req.Entity, c.req.Resource, err)
	c.finish()
	return true
}

// abandon is the caller's side of the hand-shake: it stops waiting for
// c's answer. It reports false when the answer is already in; the caller
// must then take it (it will find it on wake).
func (c *call) abandon() bool { return c.state.CompareAndSwap(callPending, callAbandoned) }

func newCall(ctx context.Context, req *backend.Request, group string) *call {
	return &call{ctx: ctx, req: req, group: group, wake: make(chan struct{}, 1)}
}

func newLanes(maxBatch int) *lanes {
	return &lanes{m: map[bucketKey]*lane{}, maxBatch: max(maxBatch, 1)}
}

// enter waits until c may decide on the buckets of keys and returns the
// calls it decides: itself first, then any followers handed to it. A
// call that shares (group != "") names one key; a call that does not may
// name two, taken in a fixed order so that two cascades over the same
// pair cannot deadlock.
//
// A nil batch and nil error mean c was answered by another call's batch.
// An error means ctx ended first and c holds nothing.
func (l *lanes) enter(ctx context.Context, c *call, keys ...bucketKey) ([]*call, error) {
	if len(keys) == 2 && less(keys[1], keys[0]) {
		keys = []bucketKey{keys[1], keys[0]}
	}
	for i, k := range keys {
		if err := l.take(ctx, c, k); err != nil {
			l.leave(keys[:i]...)
			return nil, err
		}
		if c.follower {
			return nil, nil
		}
	}
	if c.batch == nil {
		c.batch = []*call{c}
	}
	return c.batch, nil
}

// take waits for k's lane. On return without error, c either holds the
// lane or (c.follower) has been answered.
func (l *lanes) take(ctx context.Context, c *call, k bucketKey) error {
	l.mu.Lock()
	ln := l.m[k]
	if ln == nil {
		ln = &lane{}
		l.m[k] = ln
	}
	if !ln.busy {
		ln.busy = true
		l.mu.Unlock()
		return nil
	}
	ln.queue = append(ln.queue, c)
	l.mu.Unlock()

	select {
	case <-c.wake:
		return nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	for i, w := range ln.queue {
		if w == c {
			ln.queue = append(ln.queue[:i], ln.queue[i+1:]...)
			l.mu.Unlock()
			return ctx.Err()
		}
	}
	l.mu.Unlock()
	// Handed over just as ctx ended. A leader still decides for its
	// followers, whose deadlines may be later; a follower gives up unless
	// its answer is already in. Its leader may still charge it: with
	// leases the tokens then go to the lease, without them the bucket
	// loses this one call's tokens (never gains any).
	if c.follower && c.abandon() {
		return ctx.Err()
	}
	<-c.wake
	return nil
}

// leave hands each of keys' lanes to the next waiting call, with the
// calls that may share its batch, or frees it.
func (l *lanes) leave(keys ...bucketKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		ln := l.m[k]
		if len(ln.queue) == 0 {
			delete(l.m, k)
			continue
		}
		head := ln.queue[0]
		head.batch = []*call{head}
		rest := ln.queue[:0]
		for _, w := range ln.queue[1:] {
			if head.group != "" && w.group == head.group && len(head.batch) < l.maxBatch {
				w.follower = true
				head.batch = append(head.batch, w)
				continue
			}
			rest = append(rest, w)
		}
		clear(ln.queue[len(rest):])
		ln.queue = rest
		head.wake <- struct{}{}
	}
}

// answer wakes the followers of a batch not yet told their answer; one
// left undecided (its leader stopped early) gets errAbandoned.
func answer(batch []*call) {
	for _, c := range batch[1:] {
		if !c.done {
			c.err = errAbandoned
		}
		c.finish()
	}
}

// errAbandoned answers a follower whose leader stopped without deciding
// it (a panic, or every attempt failing before it was reached).
var errAbandoned = errors.New("the decision sharing this one's write did not finish")

// batchContext is the context a batch's DynamoDB calls run under
// (backend.BatchContext over its calls').
func batchContext(batch []*call) (context.Context, context.CancelFunc) {
	ctxs := make([]context.Context, len(batch))
	for i, c := range batch {
		ctxs[i] = c.ctx
	}
	return backend.BatchContext(ctxs)
}

func less(a, b bucketKey) bool {
	return a.entity < b.entity || (a.entity == b.entity && a.resource < b.resource)
}
