package backendtest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// SpanAfterIdle holds a backend to the bound over a span that starts
// after a bucket's first calls: a key of 20/s with a burst of 20 is used
// six times across ds (whose replicas take leases), left idle until the
// bucket has refilled, then stormed by 30 callers over ds for a second.
// Leases taken by the first calls count against the burst, so the storm
// admits at most B + R*T + 1 from its start, not B plus what the leases
// held; and at least 0.8 of it, or the bound was kept by refusing.
func SpanAfterIdle(t *testing.T, ds []Decider, l bucket.Limit) {
	t.Helper()
	if l.Amount != 20*bucket.Milli || l.Period != 1000 || l.Burst != 20*bucket.Milli {
		t.Fatalf("SpanAfterIdle wants a limit of 20/s with a burst of 20, got %+v", l)
	}
	req := func() *backend.Request {
		return &backend.Request{Entity: "span", Resource: "r", Defaults: []bucket.Limit{l}, Hits: 1}
	}
	for i := range 6 {
		if d, err := ds[i%len(ds)].Decide(context.Background(), req()); err != nil || !d.Allowed {
			t.Fatalf("warm-up call %d: %+v, %v", i, d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // the bucket refills to its burst
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(time.Second)
	for c := range 30 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				d, err := ds[c%len(ds)].Decide(ctx, req())
				cancel()
				if err == nil && d.Allowed && time.Now().Before(stop) {
					admitted.Add(1)
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	got := admitted.Load()
	bound := int64(20 + 20*elapsed.Seconds() + 1)
	t.Logf("admitted %d in %v from the storm's start; B + R*T + 1 = %d", got, elapsed.Round(time.Millisecond), bound)
	if got > bound {
		t.Errorf("admitted %d over %v after idle, past B + R*T + 1 = %d: leases spent on top of a refilled bucket", got, elapsed.Round(time.Millisecond), bound)
	}
	if got < bound*8/10 {
		t.Errorf("admitted %d over %v, below 0.8 of B + R*T + 1 = %d", got, elapsed.Round(time.Millisecond), bound)
	}
}
