package dynamodb

import (
	"context"
	"errors"
	"testing"
	"time"
)

// waitQueued waits until n calls wait on k's lane.
func waitQueued(t *testing.T, l *lanes, k bucketKey, n int) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		l.mu.Lock()
		got := 0
		if ln := l.m[k]; ln != nil {
			got = len(ln.queue)
		}
		l.mu.Unlock()
		if got == n {
			return
		}
	}
	t.Fatalf("never saw %d calls queued on %v", n, k)
}

// waitHeld waits until a batch holds k's lane.
func waitHeld(t *testing.T, l *lanes, k bucketKey) {
	t.Helper()
	// Long enough for the first call's config read on a busy machine.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		l.mu.Lock()
		ln := l.m[k]
		busy := ln != nil && ln.busy
		l.mu.Unlock()
		if busy {
			return
		}
	}
	t.Fatalf("no batch held %v's lane", k)
}

type entered struct {
	c     *call
	batch []*call
	err   error
}

func enterAsync(l *lanes, ctx context.Context, group string, keys ...bucketKey) (*call, chan entered) {
	c := newCall(ctx, nil, group)
	ch := make(chan entered, 1)
	go func() {
		b, err := l.enter(ctx, c, keys...)
		ch <- entered{c, b, err}
	}()
	return c, ch
}

func recv(t *testing.T, ch chan entered) entered {
	t.Helper()
	select {
	case e := <-ch:
		return e
	case <-time.After(2 * time.Second):
		t.Fatal("enter never returned")
		return entered{}
	}
}

// Calls that arrive while a bucket is held wait; on leaving, the first of
// them leads a batch of every waiting call of its group (up to the
// bound), in arrival order, and a call of another group or one that never
// shares waits for the next turn.
func TestLaneBatchesWaitingCallsOfOneGroup(t *testing.T) {
	l := newLanes(3)
	k := bucketKey{"e", "r"}
	ctx := context.Background()
	holder := newCall(ctx, nil, "g")
	if b, err := l.enter(ctx, holder, k); err != nil || len(b) != 1 || b[0] != holder {
		t.Fatalf("free lane: batch %v, err %v", b, err)
	}
	var waits []chan entered
	var calls []*call
	for i, g := range []string{"g", "other", "g", "", "g", "g"} {
		c, ch := enterAsync(l, ctx, g, k)
		calls, waits = append(calls, c), append(waits, ch)
		waitQueued(t, l, k, i+1)
	}
	l.leave(k)
	lead := recv(t, waits[0])
	if lead.err != nil || len(lead.batch) != 3 || lead.batch[0] != calls[0] || lead.batch[1] != calls[2] || lead.batch[2] != calls[4] {
		t.Fatalf("first batch: %+v, want calls 0, 2 and 4", lead)
	}
	// The followers are answered by their leader, not by the lane.
	for _, f := range lead.batch[1:] {
		f.done = true
	}
	answer(lead.batch)
	for _, i := range []int{2, 4} {
		if e := recv(t, waits[i]); e.err != nil || e.batch != nil {
			t.Fatalf("follower %d: %+v", i, e)
		}
	}
	waitQueued(t, l, k, 3) // "other", "", and the fourth "g"
	for _, i := range []int{1, 3, 5} {
		l.leave(k)
		e := recv(t, waits[i])
		if e.err != nil || len(e.batch) != 1 || e.batch[0] != calls[i] {
			t.Fatalf("call %d: %+v, want to lead alone", i, e)
		}
	}
	l.leave(k)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.m) != 0 {
		t.Fatalf("%d lanes kept after everyone left", len(l.m))
	}
}

// A waiting call gives up at its deadline and leaves the queue; a
// follower whose leader stops without deciding it is told so.
func TestLaneDeadlinesAndAbandonedFollowers(t *testing.T) {
	l := newLanes(8)
	k := bucketKey{"e", "r"}
	bg := context.Background()
	if _, err := l.enter(bg, newCall(bg, nil, "g"), k); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(bg, 20*time.Millisecond)
	defer cancel()
	_, ch := enterAsync(l, short, "g", k)
	if e := recv(t, ch); !errors.Is(e.err, context.DeadlineExceeded) {
		t.Fatalf("waited past the deadline: %+v", e)
	}
	waitQueued(t, l, k, 0)

	_, lead := enterAsync(l, bg, "g", k)
	waitQueued(t, l, k, 1)
	f, follow := enterAsync(l, bg, "g", k)
	waitQueued(t, l, k, 2)
	l.leave(k)
	e := recv(t, lead)
	if len(e.batch) != 2 || e.batch[1] != f {
		t.Fatalf("batch %+v", e)
	}
	answer(e.batch) // without deciding the follower
	recv(t, follow)
	if !errors.Is(f.err, errAbandoned) {
		t.Fatalf("abandoned follower's error: %v", f.err)
	}
	l.leave(k)
}

// Two cascades over the same pair of buckets, named in opposite orders,
// take them in one order and so cannot deadlock; another bucket is never
// held up.
func TestLaneCascadesDoNotDeadlock(t *testing.T) {
	l := newLanes(8)
	a, b, other := bucketKey{"a", "r"}, bucketKey{"b", "r"}, bucketKey{"c", "r"}
	bg := context.Background()
	if _, err := l.enter(bg, newCall(bg, nil, ""), a, b); err != nil {
		t.Fatal(err)
	}
	_, ch := enterAsync(l, bg, "", b, a)
	waitQueued(t, l, a, 1)
	if _, err := l.enter(bg, newCall(bg, nil, "g"), other); err != nil {
		t.Fatal(err)
	}
	l.leave(other)
	l.leave(a, b)
	if e := recv(t, ch); e.err != nil || len(e.batch) != 1 {
		t.Fatalf("second cascade: %+v", e)
	}
	l.leave(a, b)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.m) != 0 {
		t.Fatalf("%d lanes kept after everyone left", len(l.m))
	}
}
