package sharecache

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/regions"
)

// store is a share store in memory that counts its reads; a record set
// to fail makes every read fail.
type store struct {
	mu    sync.Mutex
	recs  map[string]regions.Record
	fail  bool
	reads atomic.Int64
	gate  chan struct{} // when set, reads wait for it
}

func (s *store) read(ctx context.Context, entity, resource string) (regions.Record, error) {
	s.reads.Add(1)
	if s.gate != nil {
		<-s.gate
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return regions.Record{}, errors.New("store down")
	}
	return s.recs[entity+"/"+resource], nil
}

func loan(parts int64) regions.Record {
	return regions.Record{In: map[regions.Region]regions.Loans{"us": {{Made: 1, From: 1, To: 9, Parts: parts}}}}
}

// cacheAt1s is a Cache of s's records kept 4.5 s, on a clock that reads
// 1 s until the test moves it.
func cacheAt1s(t *testing.T, s *store) (*Cache, *atomic.Int64) {
	t.Helper()
	now := new(atomic.Int64)
	now.Store(1_000)
	c, err := New(s.read, 4500*time.Millisecond, 10, now.Load)
	if err != nil {
		t.Fatal(err)
	}
	return c, now
}

// TestCacheKeepsForTTL: a record is reused until half its ttl after its
// read began, then read again in the background while it is still
// used, and never used past its ttl; a failed read is not kept and
// fails the call.
func TestCacheKeepsForTTL(t *testing.T) {
	s := &store{recs: map[string]regions.Record{"e/r": loan(5)}}
	c, now := cacheAt1s(t, s)
	ctx := context.Background()
	get := func() regions.Record {
		t.Helper()
		rec, err := c.Get(ctx, "e", "r")
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	if !get().Equal(loan(5)) || s.reads.Load() != 1 {
		t.Fatalf("first get: %d reads", s.reads.Load())
	}
	s.mu.Lock()
	s.recs["e/r"] = loan(7)
	s.mu.Unlock()
	now.Add(2249)
	if !get().Equal(loan(5)) || s.reads.Load() != 1 {
		t.Errorf("within half the ttl: read again (%d reads) or changed", s.reads.Load())
	}
	// From half the ttl, the record is read again behind the callers'
	// backs; they get the one they had until the new one is in.
	now.Add(1)
	if !get().Equal(loan(5)) {
		t.Error("past half the ttl: the record changed before its read")
	}
	for deadline := time.Now().Add(5 * time.Second); !get().Equal(loan(7)); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the record was not read again past half its ttl (%d reads)", s.reads.Load())
		}
	}
	if n := s.reads.Load(); n != 2 {
		t.Errorf("%d reads, want 2", n)
	}
	// Unused past its ttl, a record is read before it is used.
	now.Add(4500)
	s.mu.Lock()
	s.recs["e/r"] = loan(9)
	s.mu.Unlock()
	if !get().Equal(loan(9)) || s.reads.Load() != 3 {
		t.Errorf("at the ttl: %d reads, want the new record read", s.reads.Load())
	}
	if rec, err := c.Get(ctx, "other", "r"); err != nil || !rec.Equal(regions.Record{}) {
		t.Errorf("a key with no record: %v, %v; want the zero record", rec, err)
	}
	s.mu.Lock()
	s.fail = true
	s.mu.Unlock()
	now.Add(5000)
	if _, err := c.Get(ctx, "e", "r"); err == nil {
		t.Error("a failed read answered a record")
	}
	if _, err := c.Get(ctx, "e", "r"); err == nil {
		t.Error("a failed read was kept")
	}
}

// TestCacheSharesARead: callers that ask at once share one read, and one
// that gives up is answered at its deadline while the read goes on.
func TestCacheSharesARead(t *testing.T) {
	s := &store{recs: map[string]regions.Record{"e/r": loan(5)}, gate: make(chan struct{})}
	c, err := New(s.read, time.Second, 10, func() int64 { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.Get(short, "e", "r"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a caller past its deadline: %v", err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if rec, err := c.Get(context.Background(), "e", "r"); err != nil || !rec.Equal(loan(5)) {
				t.Errorf("%v, %v", rec, err)
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	close(s.gate)
	wg.Wait()
	if n := s.reads.Load(); n != 1 {
		t.Errorf("%d reads for nine callers, want 1", n)
	}
	// Keys that would run together without a separator stay apart.
	s.recs["ab/c"], s.recs["a/bc"] = loan(1), loan(2)
	x, _ := c.Get(context.Background(), "ab", "c")
	y, _ := c.Get(context.Background(), "a", "bc")
	if x.Equal(y) {
		t.Error("two keys shared a record")
	}
}

// TestCacheRefreshWaitsForNobody: a read behind the callers' backs that
// hangs keeps nobody waiting until the record it would replace is past
// its ttl; then callers wait, and give up at their deadlines.
func TestCacheRefreshWaitsForNobody(t *testing.T) {
	s := &store{recs: map[string]regions.Record{"e/r": loan(5)}}
	var now atomic.Int64
	c, err := New(s.read, time.Second, 10, now.Load)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(context.Background(), "e", "r"); err != nil {
		t.Fatal(err)
	}
	s.gate = make(chan struct{})
	defer close(s.gate)
	now.Store(900)
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		rec, err := c.Get(ctx, "e", "r")
		cancel()
		if err != nil || !rec.Equal(loan(5)) {
			t.Errorf("while the read hangs, before the ttl: %v, %v; want the record kept", rec, err)
		}
	}
	now.Store(1_000)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.Get(ctx, "e", "r"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("past the ttl, the read hanging: %v, want the caller's deadline", err)
	}
	if n := s.reads.Load(); n != 2 {
		t.Errorf("%d reads, want the first and one hanging", n)
	}
}

// Prefetch starts the read a decision will wait for and returns at once;
// the decision that asks next shares that read, and a record young
// enough is not read again.
func TestPrefetchReadsAhead(t *testing.T) {
	s := &store{recs: map[string]regions.Record{"e/r": loan(5)}, gate: make(chan struct{})}
	c, now := cacheAt1s(t, s)
	ctx := context.Background()
	c.Prefetch(ctx, "e", "r") // returns with the read held at the gate
	done := make(chan regions.Record)
	go func() {
		rec, err := c.Get(ctx, "e", "r")
		if err != nil {
			t.Error(err)
		}
		done <- rec
	}()
	close(s.gate)
	if rec := <-done; rec.In["us"][0].Parts != 5 {
		t.Fatalf("Get after Prefetch: %+v", rec)
	}
	if n := s.reads.Load(); n != 1 {
		t.Fatalf("%d reads for a Prefetch and a Get at once, want 1", n)
	}
	now.Add(2000) // under half of 4.5 s
	c.Prefetch(ctx, "e", "r")
	if n := s.reads.Load(); n != 1 {
		t.Fatalf("%d reads after a Prefetch of a young record, want 1", n)
	}
	now.Add(500) // past half
	c.Prefetch(ctx, "e", "r")
	for s.reads.Load() != 2 {
		time.Sleep(time.Millisecond)
	}
}
