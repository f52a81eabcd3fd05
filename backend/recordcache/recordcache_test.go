package recordcache

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// store counts reads and answers each with a Set naming the read.
type store struct {
	reads atomic.Int64
	fail  atomic.Bool
	gate  chan struct{} // when set, a read waits for it
}

func (s *store) fetch(ctx context.Context, entity, resource string) (*Set, error) {
	n := s.reads.Add(1)
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if s.fail.Load() {
		return nil, errors.New("store down")
	}
	return &Set{Parent: entity + "/" + resource, HasSystemConfig: true,
		SystemConfig: backend.Record{Limits: []bucket.Limit{{Name: "n", Amount: n * bucket.Milli, Period: 1000, Burst: bucket.Milli}}}}, nil
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// A miss reads, a hit does not; an entry past three quarters of its TTL
// is answered from and replaced in the background; one past its TTL is
// read again; a failed read is not cached; the size is bounded.
func TestCache(t *testing.T) {
	s := &store{}
	var hits, misses atomic.Uint64
	var now atomic.Int64 // the refresh's clock; the LRU's expiry runs on real time
	c := New(Options{Fetch: s.fetch, Size: 2, TTL: time.Minute, Hits: &hits, Misses: &misses, Now: now.Load})
	defer c.Close()
	ctx := t.Context()
	get := func(c *Cache, entity string) *Set {
		t.Helper()
		set, err := c.Get(ctx, entity, "r")
		if err != nil {
			t.Fatal(err)
		}
		return set
	}
	first := get(c, "a")
	if first.Parent != "a/r" || s.reads.Load() != 1 || misses.Load() != 1 {
		t.Fatalf("first lookup: %+v, %d reads, %d misses", first, s.reads.Load(), misses.Load())
	}
	now.Store(44_000) // before 3/4 of the TTL
	if get(c, "a") != first || s.reads.Load() != 1 || hits.Load() != 1 {
		t.Fatalf("second lookup read again (%d reads) or missed (%d hits)", s.reads.Load(), hits.Load())
	}
	now.Store(45_000) // at 3/4
	if get(c, "a") != first {
		t.Fatal("an entry due for refresh was not answered from")
	}
	waitFor(t, "the background refresh", func() bool { return s.reads.Load() == 2 })
	waitFor(t, "the refreshed entry", func() bool { return get(c, "a") != first })
	get(c, "b")
	get(c, "c")
	if c.Len() != 2 {
		t.Errorf("%d entries, want at most 2", c.Len())
	}

	short := New(Options{Fetch: s.fetch, TTL: 100 * time.Millisecond})
	defer short.Close()
	get(short, "a")
	reads := s.reads.Load()
	time.Sleep(200 * time.Millisecond) // past the TTL
	get(short, "a")
	if s.reads.Load() != reads+1 {
		t.Fatal("an expired entry was answered from")
	}
	s.fail.Store(true)
	time.Sleep(200 * time.Millisecond)
	for range 2 {
		if _, err := short.Get(ctx, "a", "r"); err == nil {
			t.Fatal("a failed read answered")
		}
	}
	if s.reads.Load() != reads+3 {
		t.Errorf("a failed read was cached: %d reads, want %d", s.reads.Load(), reads+3)
	}
}

// Concurrent misses for one key cost one read, which does not end with
// the first caller's deadline: a caller that gives up does not fail the
// others, and the read still fills the cache.
func TestMissesShareOneRead(t *testing.T) {
	s := &store{gate: make(chan struct{})}
	c := New(Options{Fetch: s.fetch})
	defer c.Close()
	short, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.Get(short, "a", "r"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a caller past its deadline: %v", err)
	}
	var wg sync.WaitGroup
	sets := make([]*Set, 8)
	for i := range sets {
		wg.Go(func() {
			set, err := c.Get(t.Context(), "a", "r")
			if err != nil {
				t.Error(err)
			}
			sets[i] = set
		})
	}
	time.Sleep(20 * time.Millisecond)
	close(s.gate)
	wg.Wait()
	for _, set := range sets {
		if set != sets[0] || set == nil {
			t.Fatal("callers of one read got different answers")
		}
	}
	if n := s.reads.Load(); n != 1 {
		t.Errorf("%d reads for one key, want 1", n)
	}
	if set, _ := c.Get(t.Context(), "a", "r"); set != sets[0] || s.reads.Load() != 1 {
		t.Error("the shared read did not fill the cache")
	}
}

// Lookup answers from the cache, or begins a read for a key not cached
// and shares it with Get. Wait answers with the records once they are in,
// even to a caller whose context has ended since, and with the read's
// error when it failed.
func TestLookupAndWait(t *testing.T) {
	s := &store{gate: make(chan struct{})}
	var hits, misses atomic.Uint64
	c := New(Options{Fetch: s.fetch, Hits: &hits, Misses: &misses})
	defer c.Close()
	set, p := c.Lookup("a", "r")
	if set != nil || misses.Load() != 1 {
		t.Fatalf("Lookup on an empty cache: %v, %d misses", set, misses.Load())
	}
	got := make(chan *Set, 1)
	go func() {
		set, err := c.Get(t.Context(), "a", "r")
		if err != nil {
			t.Error(err)
		}
		got <- set
	}()
	short, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	if _, err := p.Wait(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past its deadline with the read in flight: %v", err)
	}
	close(s.gate)
	shared := <-got           // Get had joined the read; it is in now
	set, err := p.Wait(short) // ended, but the read is in
	if err != nil || set == nil || set != shared {
		t.Fatalf("Wait after the read: %v, %v (or Get got another answer)", set, err)
	}
	if n := s.reads.Load(); n != 1 {
		t.Fatalf("%d reads, want the one Lookup began", n)
	}
	if set, _ := c.Lookup("a", "r"); set != shared || hits.Load() != 1 {
		t.Fatalf("Lookup on a cached key: %v, %d hits", set, hits.Load())
	}
	s.fail.Store(true)
	if set, p := c.Lookup("b", "r"); set != nil {
		t.Fatal("Lookup on another key answered from the cache")
	} else if _, err := p.Wait(t.Context()); err == nil {
		t.Fatal("a failed read answered no error")
	}
}
