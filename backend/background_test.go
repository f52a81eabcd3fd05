package backend

import (
	"context"
	"testing"
	"time"
)

// Close lets work under way finish within its grace before cancelling
// anything, cancels what outlasts the grace, ends the sweep at once, and
// starts nothing after it has begun.
func TestBackgroundClose(t *testing.T) {
	g := NewBackground()
	landed := make(chan error, 1)
	g.Go(func() {
		// A write that takes 50 ms: it lands, uncancelled.
		select {
		case <-time.After(50 * time.Millisecond):
			landed <- nil
		case <-g.Context().Done():
			landed <- g.Context().Err()
		}
	})
	hung := make(chan error, 1)
	g.Go(func() {
		<-g.Context().Done() // a write that never returns on its own
		hung <- g.Context().Err()
	})
	sweep := make(chan struct{})
	g.Go(func() {
		<-g.SweepContext().Done()
		close(sweep)
	})
	start := time.Now()
	if !g.Close(time.Second) {
		t.Fatal("the first Close reported it was not the first")
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("Close returned after %v, before its grace of 1 s for the hung work", took)
	}
	if err := <-landed; err != nil {
		t.Errorf("the 50 ms write was cancelled (%v) within Close's grace", err)
	}
	if err := <-hung; err == nil {
		t.Error("the hung work was not cancelled after the grace")
	}
	select {
	case <-sweep:
	default:
		t.Error("the sweep's context is not done")
	}
	if g.Go(func() {}) {
		t.Error("Go ran work after Close")
	}
	if g.Close(time.Second) {
		t.Error("a second Close reported it was the first")
	}
	if g.Context().Err() != context.Canceled {
		t.Errorf("the context after Close: %v", g.Context().Err())
	}
}
