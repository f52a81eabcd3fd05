package dynamodb

import (
	"context"
	"testing"
	"time"
)

func TestGatesOneHolderAndDeadlines(t *testing.T) {
	g := newGates()
	a, b := bucketKey{"a", "r"}, bucketKey{"b", "r"}
	leaveA, err := g.enter(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	// A second decision on a waits, and gives up at its deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := g.enter(ctx, a); err == nil {
		t.Fatal("entered a taken gate")
	}
	// Another bucket is not held up, nor is a cascade in the other order
	// once a is free.
	leaveB, err := g.enter(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	leaveB()
	done := make(chan struct{})
	go func() {
		leave, err := g.enter(context.Background(), b, a)
		if err == nil {
			leave()
		}
		close(done)
	}()
	time.Sleep(10 * time.Millisecond)
	leaveA()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("cascade never entered after the gate was left")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.m) != 0 {
		t.Fatalf("%d gates kept after everyone left", len(g.m))
	}
}
