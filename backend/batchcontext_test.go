package backend

import (
	"context"
	"testing"
	"time"
)

type ctxKey struct{}

// A batch lives as long as its longest-waiting caller, whether the
// callers end by deadline or by cancellation, and carries the first
// caller's values.
func TestBatchContext(t *testing.T) {
	bg := context.WithValue(context.Background(), ctxKey{}, "first")
	t.Run("deadlines", func(t *testing.T) {
		short, cancelShort := context.WithTimeout(bg, 10*time.Millisecond)
		defer cancelShort()
		long, cancelLong := context.WithTimeout(context.Background(), 400*time.Millisecond)
		defer cancelLong()
		want, _ := long.Deadline()
		ctx, release := BatchContext([]context.Context{short, long})
		defer release()
		if d, ok := ctx.Deadline(); !ok || !d.Equal(want) {
			t.Fatalf("batch deadline %v (%v), want the latest caller's %v", d, ok, want)
		}
		if ctx.Value(ctxKey{}) != "first" {
			t.Error("batch context lost the first caller's values")
		}
		<-short.Done()
		cancelShort()
		if ctx.Err() != nil {
			t.Fatal("batch ended with its first caller")
		}
		mustEnd(t, ctx, "batch outlived its latest deadline")
	})
	t.Run("cancellation", func(t *testing.T) {
		a, cancelA := context.WithCancel(bg)
		b, cancelB := context.WithTimeout(context.Background(), time.Hour)
		defer cancelB()
		ctx, release := BatchContext([]context.Context{a, b})
		defer release()
		if _, ok := ctx.Deadline(); ok {
			t.Error("batch has a deadline though a caller has none")
		}
		cancelA()
		time.Sleep(10 * time.Millisecond)
		if ctx.Err() != nil {
			t.Fatal("batch ended with its first caller")
		}
		cancelB()
		mustEnd(t, ctx, "batch outlived every caller")
	})
	t.Run("released", func(t *testing.T) {
		a, cancelA := context.WithCancel(bg)
		defer cancelA()
		ctx, release := BatchContext([]context.Context{a, context.Background()})
		release()
		if ctx.Err() == nil {
			t.Fatal("released batch context still alive")
		}
	})
}

// mustEnd fails with why unless ctx ends within a few seconds.
func mustEnd(t *testing.T, ctx context.Context, why string) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal(why)
	}
}
