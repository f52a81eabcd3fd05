package dynamodb

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// The bound holds over a span that starts after the bucket's first calls:
// a key used a few times (its replicas take leases), left idle until the
// bucket has refilled, then a storm on every replica. The leases taken
// by the first calls count against the burst (the item's ot and rm), so
// the storm admits at most B + R*T + 1 from its start, not B plus what
// the leases held.
func TestSpanAfterIdleHoldsTheBound(t *testing.T) {
	e := newEnv(t)
	now := func() int64 { return time.Now().UnixMilli() }
	var replicas []*Backend
	for range 3 {
		replicas = append(replicas, e.replica(t, Options{Now: now}, slowWrites{e.client, 5 * time.Millisecond}))
	}
	l := lim(t, "x", "20/s", 20)
	req := func() *backend.Request {
		return &backend.Request{Entity: "span", Resource: "r", Defaults: []bucket.Limit{l}, Hits: 1}
	}
	for i := range 6 {
		if d, err := replicas[i%3].Decide(context.Background(), req()); err != nil || !d.Allowed {
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
				d, err := replicas[c%3].Decide(ctx, req())
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
