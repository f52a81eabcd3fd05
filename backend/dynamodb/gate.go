package dynamodb

import (
	"context"
	"sync"
)

// gates lets one decision per bucket at a time talk to DynamoDB on this
// replica; later decisions for the same bucket wait (within their
// deadline) and then start from the state the earlier one saw. Without
// it, every caller of a hot bucket would race every other for each new
// token, and all but one of those conditional writes would fail. There is
// no lock across buckets: each bucket has its own gate, and gates nobody
// holds are dropped.
type gates struct {
	mu sync.Mutex
	m  map[bucketKey]*gate
}

type gate struct {
	ch   chan struct{} // holds a token while the gate is taken
	refs int           // holders and waiters; guarded by gates.mu
}

func newGates() *gates { return &gates{m: map[bucketKey]*gate{}} }

// enter takes the gates of keys (in a fixed order, so two cascades over
// the same pair cannot deadlock) and returns the func that leaves them.
func (g *gates) enter(ctx context.Context, keys ...bucketKey) (leave func(), err error) {
	if len(keys) == 2 && less(keys[1], keys[0]) {
		keys = []bucketKey{keys[1], keys[0]}
	}
	taken := make([]bucketKey, 0, len(keys))
	leave = func() {
		for _, k := range taken {
			g.release(k, true)
		}
	}
	for _, k := range keys {
		gt := g.acquire(k)
		select {
		case gt.ch <- struct{}{}:
			taken = append(taken, k)
		case <-ctx.Done():
			g.release(k, false)
			leave()
			return nil, ctx.Err()
		}
	}
	return leave, nil
}

func (g *gates) acquire(k bucketKey) *gate {
	g.mu.Lock()
	defer g.mu.Unlock()
	gt, ok := g.m[k]
	if !ok {
		gt = &gate{ch: make(chan struct{}, 1)}
		g.m[k] = gt
	}
	gt.refs++
	return gt
}

func (g *gates) release(k bucketKey, held bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	gt := g.m[k]
	if held {
		<-gt.ch
	}
	if gt.refs--; gt.refs == 0 {
		delete(g.m, k)
	}
}

func less(a, b bucketKey) bool {
	return a.entity < b.entity || (a.entity == b.entity && a.resource < b.resource)
}
