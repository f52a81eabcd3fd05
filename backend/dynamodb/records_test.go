package dynamodb

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// slowConfigReads makes every BatchGetItem take delay and counts them.
type slowConfigReads struct {
	API
	delay time.Duration
	reads atomic.Int64
}

func (s *slowConfigReads) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	s.reads.Add(1)
	time.Sleep(s.delay)
	return s.API.BatchGetItem(ctx, in, o...)
}

// In steady use a bucket's config is never read on the decision path:
// entries past three quarters of their TTL are answered from and
// replaced in the background, and a limit changed in the table still
// reaches decisions within the TTL.
func TestConfigReadsStayOffTheDecisionPath(t *testing.T) {
	e := newEnv(t)
	// The background read starts at three quarters of the TTL and must
	// be back before the TTL ends: a quarter of a second for a read of
	// 30 ms and more, on a machine that may be busy (with 400 ms, 100 ms
	// was not always enough beside a benchmark).
	const ttl = time.Second
	api := &slowConfigReads{API: e.client, delay: 30 * time.Millisecond}
	b := e.replica(t, Options{ConfigCacheTTL: ttl, Now: func() int64 { return time.Now().UnixMilli() }}, api)
	defer b.Close()
	ctx := context.Background()
	a := e.admin(t, "")
	if _, err := a.PutConfig(ctx, backend.RecordKey{Entity: "e", Resource: "r"}, []bucket.Limit{lim(t, "old", "1000/s", 0)}, 0); err != nil {
		t.Fatal(err)
	}
	req := backend.Request{Entity: "e", Resource: "r", Hits: 1}
	mustDecide(t, b, req) // the one miss
	start := time.Now()
	changed := time.Time{}
	var slowest time.Duration
	for time.Since(start) < 3*ttl {
		t0 := time.Now()
		d := mustDecide(t, b, req)
		slowest = max(slowest, time.Since(t0))
		if changed.IsZero() && time.Since(start) > ttl {
			if _, err := a.PutConfig(ctx, backend.RecordKey{Entity: "e", Resource: "r"}, []bucket.Limit{lim(t, "new", "1000/s", 0)}, 0); err != nil {
				t.Fatal(err)
			}
			changed = time.Now()
		}
		// Within the TTL, and the read that brings the change.
		if !changed.IsZero() && time.Since(changed) > ttl+250*time.Millisecond && d.Limits[0].Name != "new" {
			t.Fatalf("limit changed %v ago still not seen", time.Since(changed))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if m := b.Stats().CacheMisses.Load(); m != 1 {
		t.Fatalf("%d config cache misses over %v of steady use, want the first only", m, 3*ttl)
	}
	if n := api.reads.Load(); n < 3 {
		t.Fatalf("%d config reads in %v: the entry was not refreshed in the background", n, 3*ttl)
	}
	t.Logf("%d background reads; slowest decision %v (a config read takes %v)", api.reads.Load()-1, slowest, api.delay)
}

// Concurrent misses for one bucket cost one read, and that read is not
// bound to the first caller's deadline: a caller that gives up early does
// not fail the others, and the read still fills the cache.
func TestConfigMissesShareOneReadOnItsOwnDeadline(t *testing.T) {
	e := newEnv(t)
	api := &slowConfigReads{API: e.client, delay: 150 * time.Millisecond}
	b := e.replica(t, Options{}, api)
	defer b.Close()
	req := backend.Request{Entity: "e", Resource: "r", Defaults: []bucket.Limit{lim(t, "x", "1000/s", 0)}, Hits: 1}

	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	var shortErr error
	wg.Go(func() { _, shortErr = b.Decide(short, &req) })
	time.Sleep(5 * time.Millisecond)
	errs := make([]error, 10)
	for i := range errs {
		wg.Go(func() {
			r := req
			_, errs[i] = b.Decide(context.Background(), &r)
		})
	}
	wg.Wait()
	if !errors.Is(shortErr, context.DeadlineExceeded) {
		t.Fatalf("the 20 ms caller: %v, want its deadline", shortErr)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("caller %d failed with the first caller's deadline: %v", i, err)
		}
	}
	if n := api.reads.Load(); n != 1 {
		t.Fatalf("%d config reads for 11 concurrent misses, want 1", n)
	}

	// A lone caller too short for the read still leaves it cached.
	other := backend.Request{Entity: "f", Resource: "r", Defaults: req.Defaults, Hits: 1}
	ctx, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	if _, err := b.Decide(ctx, &other); err == nil {
		t.Fatal("decided within 20 ms over a 150 ms read")
	}
	time.Sleep(200 * time.Millisecond)
	misses := b.Stats().CacheMisses.Load()
	mustDecide(t, b, other)
	if b.Stats().CacheMisses.Load() != misses || api.reads.Load() != 2 {
		t.Fatalf("the abandoned read was not cached: misses %d -> %d, reads %d", misses, b.Stats().CacheMisses.Load(), api.reads.Load())
	}
}

// A bucket whose resource is _default_ (a resource template can yield
// it) takes the entity's _default_ config, as the memory backend does,
// rather than falling through to the rule's limits.
func TestEntityConfigForResourceDefault(t *testing.T) {
	e := newEnv(t)
	b := e.replica(t, Options{})
	own := []bucket.Limit{lim(t, "own", "5/s", 0)}
	if _, err := e.admin(t, "").PutConfig(t.Context(), backend.RecordKey{Entity: "e", Resource: backend.DefaultResource}, own, 0); err != nil {
		t.Fatal(err)
	}
	d := mustDecide(t, b, backend.Request{Entity: "e", Resource: backend.DefaultResource, Defaults: []bucket.Limit{lim(t, "rule", "1/s", 0)}, Hits: 1})
	if len(d.Limits) != 1 || d.Limits[0].Name != "own" || d.Level != backend.LevelEntity {
		t.Fatalf("decided on %v at level %v, want the entity's own limit", d.Limits, d.Level)
	}
}
