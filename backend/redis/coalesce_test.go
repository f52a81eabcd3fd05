package redis

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
	"github.com/sluice-rl/sluice/internal/faultproxy"
)

// hotLoad runs callers goroutines on each of the backends, each deciding
// perCaller requests of one hit on one bucket, and returns how many were
// allowed.
func hotLoad(t *testing.T, bes []*Backend, callers, perCaller int, req backend.Request) int64 {
	t.Helper()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, len(bes)*callers)
	for _, b := range bes {
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perCaller {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					r := req
					d, err := b.Decide(ctx, &r)
					cancel()
					if err != nil {
						errs <- err
						return
					}
					if d.Allowed {
						allowed.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return allowed.Load()
}

// A hot bucket's decisions on one replica share runs of the script while
// one is in flight: three replicas behind a link of 2 ms, 32 callers
// each, on one bucket of 1,000 tokens that does not refill, admit exactly
// 1,000 of 2,880 requests (the bound holds across the replicas and the
// batches), in far fewer runs than decisions; with sharing off, one run
// each, and the same bound.
func TestCoalescedDecisionsKeepTheBound(t *testing.T) {
	srv := redistest.Require(t)
	proxy, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	proxy.SetDelay(2 * time.Millisecond)
	clk := newFakeClock() // no refill: the bound is the burst, exactly
	for _, c := range []struct {
		name     string
		maxBatch int
	}{{"shared", 0}, {"alone", 1}} {
		t.Run(c.name, func(t *testing.T) {
			var bes []*Backend
			for range 3 {
				client, err := Dial(context.Background(), Conn{URL: "redis://" + proxy.Addr()})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(client.Close)
				bes = append(bes, newBackend(t, client, Options{KeyPrefix: c.name, Now: clk.now, MaxBatch: c.maxBatch}))
			}
			req := backend.Request{Entity: "hot", Resource: "chat", Hits: 1, Defaults: []bucket.Limit{
				{Name: "burst", Amount: 0, Period: bucket.Second, Burst: 1000 * bucket.Milli},
				{Name: "rps", Amount: 1_000_000 * bucket.Milli, Period: bucket.Second, Burst: 1_000_000 * bucket.Milli, PerRequest: true},
			}}
			const callers, perCaller = 32, 30
			allowed := hotLoad(t, bes, callers, perCaller, req)
			if allowed != 1000 {
				t.Errorf("%d of %d allowed, want the burst's 1000", allowed, 3*callers*perCaller)
			}
			var scripts, coalesced uint64
			for _, b := range bes {
				scripts += b.Stats().Scripts.Load()
				coalesced += b.Stats().Coalesced.Load()
			}
			decisions := uint64(3 * callers * perCaller)
			t.Logf("%d decisions in %d runs of the script (%d coalesced)", decisions, scripts, coalesced)
			if scripts+coalesced != decisions {
				t.Errorf("%d runs and %d coalesced for %d decisions", scripts, coalesced, decisions)
			}
			switch {
			case c.maxBatch == 1 && scripts != decisions:
				t.Errorf("sharing off: %d runs for %d decisions", scripts, decisions)
			case c.maxBatch != 1 && scripts > decisions/4:
				t.Errorf("a hot bucket took %d runs for %d decisions: not coalesced", scripts, decisions)
			}
		})
	}
}

// A follower whose deadline ends while its batch is in flight gets its
// error by that deadline; the batch still answers the others.
func TestCoalescedCallerGivesUpAlone(t *testing.T) {
	srv := redistest.Require(t)
	proxy, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	client, err := Dial(context.Background(), Conn{URL: "redis://" + proxy.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	b := newBackend(t, client, Options{})
	req := backend.Request{Entity: "e", Resource: "r", Hits: 1,
		Defaults: []bucket.Limit{{Name: "rps", Amount: 1000 * bucket.Milli, Period: bucket.Second, Burst: 1000 * bucket.Milli}}}
	if _, err := b.Decide(context.Background(), &req); err != nil { // config records cached
		t.Fatal(err)
	}
	proxy.SetDelay(300 * time.Millisecond)
	var wg sync.WaitGroup
	results := make([]error, 8)
	took := make([]time.Duration, 8)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			timeout := 5 * time.Second
			if i%2 == 1 {
				timeout = 100 * time.Millisecond
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			r := req
			start := time.Now()
			_, results[i] = b.Decide(ctx, &r)
			took[i] = time.Since(start)
		}()
		time.Sleep(5 * time.Millisecond) // the first leads; the rest queue behind it
	}
	wg.Wait()
	for i, err := range results {
		switch {
		case i%2 == 1 && (err == nil || took[i] > time.Second):
			t.Errorf("call %d with 100 ms: %v after %v", i, err, took[i])
		case i%2 == 0 && err != nil:
			t.Errorf("call %d with 5 s: %v", i, err)
		}
	}
}

// A replica's concurrent decisions share runs of the script whatever
// buckets they are on, and every bound holds: three replicas behind a
// link of 2 ms, 16 callers each on 16 buckets (100 tokens each, no
// refill) that all cascade to one parent (600 tokens), admit exactly 600
// of 2,880 requests, no bucket more than its 100, in far fewer runs than
// decisions. On a Cluster, where a run may touch one slot only, runs
// are shared per hash tag (here every bucket's own, with no parent):
// nothing crosses slots, and each bucket admits exactly its 100.
func TestCoalescedAcrossBuckets(t *testing.T) {
	clk := newFakeClock() // no refill: the bounds are the bursts, exactly
	child := []bucket.Limit{{Name: "burst", Amount: 0, Period: bucket.Second, Burst: 100 * bucket.Milli}}
	parent := []bucket.Limit{{Name: "burst", Amount: 0, Period: bucket.Second, Burst: 600 * bucket.Milli}}
	const replicas, callers, perCaller, buckets = 3, 16, 60, 16

	// load runs every replica's callers, caller i on bucket i%buckets,
	// and returns how many were allowed per bucket.
	load := func(t *testing.T, bes []*Backend, cascade bool) [buckets]int64 {
		t.Helper()
		var allowed [buckets]atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, replicas*callers)
		for _, b := range bes {
			for i := range callers {
				wg.Go(func() {
					for range perCaller {
						req := backend.Request{Entity: "e" + strconv.Itoa(i%buckets), Resource: "chat", Hits: 1, Defaults: child}
						if cascade {
							req.Parent = "org"
						}
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						d, err := b.Decide(ctx, &req)
						cancel()
						if err != nil {
							errs <- err
							return
						}
						if d.Allowed {
							allowed[i%buckets].Add(1)
						}
					}
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		var out [buckets]int64
		for i := range out {
			out[i] = allowed[i].Load()
		}
		return out
	}
	runs := func(bes []*Backend) (scripts uint64) {
		for _, b := range bes {
			scripts += b.Stats().Scripts.Load()
		}
		return scripts
	}
	const decisions = replicas * callers * perCaller

	t.Run("one Redis", func(t *testing.T) {
		srv := redistest.Require(t)
		proxy, err := faultproxy.New(srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { proxy.Close() })
		putRecord(t, srv, Keys{}.EntityConfig("org", "chat"), parent)
		var bes []*Backend
		for range replicas {
			client, err := Dial(context.Background(), Conn{URL: "redis://" + proxy.Addr()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(client.Close)
			bes = append(bes, newBackend(t, client, Options{Now: clk.now}))
		}
		// The config records are read before the link slows, so that
		// the runs counted are the decisions'.
		for _, b := range bes {
			req := backend.Request{Entity: "e0", Resource: "chat", Parent: "org", Defaults: child}
			if _, err := b.Decide(context.Background(), &req); err != nil {
				t.Fatal(err)
			}
		}
		proxy.SetDelay(2 * time.Millisecond)
		before := runs(bes)
		allowed := load(t, bes, true)
		var total int64
		for i, n := range allowed {
			total += n
			if n > 100 {
				t.Errorf("bucket e%d admitted %d, over its 100", i, n)
			}
		}
		if total != 600 {
			t.Errorf("%d of %d admitted (%v), want the parent's 600", total, decisions, allowed)
		}
		scripts := runs(bes) - before
		t.Logf("%d decisions on %d buckets in %d runs of the script", decisions, buckets, scripts)
		// A run goes out as the one before it returns, so its callers
		// make the one after: each replica's 16 callers alternate in two
		// batches of about 8. Alone, each decision would be a run.
		if scripts > decisions/4 {
			t.Errorf("%d runs for %d decisions on %d buckets: not coalesced across buckets", scripts, decisions, buckets)
		}
	})

	t.Run("Cluster", func(t *testing.T) {
		cluster := redistest.RequireCluster(t, 3)
		var bes []*Backend
		for range replicas {
			client, err := Dial(context.Background(), Conn{URL: cluster.URL()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(client.Close)
			bes = append(bes, newBackend(t, client, Options{Now: clk.now}))
		}
		allowed := load(t, bes, false)
		for i, n := range allowed {
			if n != 100 {
				t.Errorf("bucket e%d admitted %d, want its 100", i, n)
			}
		}
		t.Logf("%d decisions on %d hash tags in %d runs of the script", decisions, buckets, runs(bes))
	})
}
