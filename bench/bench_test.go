package bench

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/memory"
)

// benchConcurrency is the number of goroutines the gRPC benchmarks run,
// the sluice-bench default: with RunParallel's default of one goroutine
// per P, two cores would keep only two calls in flight and measure
// latency, not what the server sustains.
const benchConcurrency = 64

// newMemory returns the Sluice service the benchmarks measure: RulesYAML
// on a memory backend with the TTL rules `sluice serve` applies by
// default, released when tb ends.
func newMemory(tb testing.TB) (rlsv3.RateLimitServiceServer, []grpc.ServerOption) {
	tb.Helper()
	svc, opts, release, err := NewMemoryService(RulesYAML, memory.Options{TTLMultiplier: backend.DefaultTTLMultiplier})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(release)
	return svc, opts
}

// serve starts svc on loopback for the length of tb.
func serve(tb testing.TB, svc rlsv3.RateLimitServiceServer, opts ...grpc.ServerOption) string {
	tb.Helper()
	addr, stop, err := Serve(svc, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := stop(); err != nil {
			tb.Error(err)
		}
	})
	return addr
}

// BenchmarkShouldRateLimit measures one-descriptor calls over real gRPC on
// loopback against the do-nothing baseline and Sluice's memory backend,
// with the same client, connections and concurrency. ns/op is wall time
// per call at that concurrency (the inverse of throughput); allocs/op
// counts client and server together, as both run in this process.
func BenchmarkShouldRateLimit(b *testing.B) {
	b.Run("noop", func(b *testing.B) { benchGRPC(b, NoopServer{}) })
	b.Run("memory", func(b *testing.B) {
		svc, opts := newMemory(b)
		benchGRPC(b, svc, opts...)
	})
}

func benchGRPC(b *testing.B, svc rlsv3.RateLimitServiceServer, opts ...grpc.ServerOption) {
	addr := serve(b, svc, opts...)
	clients, closeConns, err := dial(addr, DefaultConns)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(closeConns)
	reqs, err := SingleKey().build()
	if err != nil {
		b.Fatal(err)
	}
	req := reqs.reqs[0]
	ctx := b.Context()
	for _, c := range clients { // connect before the clock starts
		if _, err := c.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Uint32
	b.ReportAllocs()
	b.SetParallelism(max(1, benchConcurrency/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := clients[int(next.Add(1))%len(clients)]
		for pb.Next() {
			resp, err := c.ShouldRateLimit(ctx, req)
			if err != nil {
				b.Error(err)
				return
			}
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				b.Errorf("answer %v, want OK", resp.GetOverallCode())
				return
			}
		}
	})
}

// BenchmarkServiceDecide calls the service directly, without gRPC, so that
// allocs/op is Sluice's own per call: validation, match, backend decision
// and the response it builds.
func BenchmarkServiceDecide(b *testing.B) {
	svc, _ := newMemory(b)
	reqs, err := SingleKey().build()
	if err != nil {
		b.Fatal(err)
	}
	req := reqs.reqs[0]
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		resp, err := svc.ShouldRateLimit(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			b.Fatalf("answer %v, want OK", resp.GetOverallCode())
		}
	}
}

// TestRunMemory checks the driver, not performance: a short bounded run
// against the memory server sends calls, gets no errors, and sees every
// call answered OK under RulesYAML's huge limit.
func TestRunMemory(t *testing.T) {
	svc, opts := newMemory(t)
	addr := serve(t, svc, opts...)
	for _, w := range []Workload{
		SingleKey(),
		{Domain: Domain, Entries: []Entry{{Key, "u"}}, Dist: Uniform, Keys: 100},
		{Domain: Domain, Entries: []Entry{{Key, "h"}}, Dist: Hot, Keys: 10, HotFraction: 0.5},
	} {
		t.Run(w.Dist.String(), func(t *testing.T) {
			r, err := Run(t.Context(), Config{
				Addr: addr, Concurrency: 8, Conns: 2,
				Duration: 200 * time.Millisecond, Warmup: 20 * time.Millisecond,
				Workload: w,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", r)
			switch {
			case r.Requests == 0:
				t.Fatal("no calls completed")
			case r.Errors != 0:
				t.Fatalf("%d errors, first: %v", r.Errors, r.FirstError)
			case r.OK != r.Requests || r.OverLimit != 0:
				t.Fatalf("%d calls, %d OK, %d over limit: want all OK", r.Requests, r.OK, r.OverLimit)
			case r.Throughput <= 0 || r.Elapsed < 200*time.Millisecond:
				t.Fatalf("throughput %v over %v", r.Throughput, r.Elapsed)
			case r.P50 <= 0 || r.P50 > r.P99 || r.P99 > r.P999 || r.P999 > r.Max:
				t.Fatalf("latencies out of order: p50 %v p99 %v p999 %v max %v", r.P50, r.P99, r.P999, r.Max)
			}
		})
	}
}

// TestRunRequestBound checks that a count bound stops the run at exactly
// that many calls, well before its duration.
func TestRunRequestBound(t *testing.T) {
	addr := serve(t, NoopServer{})
	r, err := Run(t.Context(), Config{Addr: addr, Concurrency: 4, Conns: 1, Duration: time.Minute, Requests: 300, Workload: SingleKey()})
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != 300 || r.OK != 300 || r.Errors != 0 {
		t.Fatalf("%+v: want 300 calls, all OK", r)
	}
}

// TestRunCancel checks that cancelling the context ends a long run early.
func TestRunCancel(t *testing.T) {
	addr := serve(t, NoopServer{})
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := Run(ctx, Config{Addr: addr, Concurrency: 2, Duration: time.Minute, Workload: SingleKey()}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("run took %v after its context ended", d)
	}
}

func TestRunRejects(t *testing.T) {
	for name, cfg := range map[string]Config{
		"remote":      {Addr: "192.0.2.1:8081", Duration: time.Second, Workload: SingleKey()},
		"no port":     {Addr: "127.0.0.1", Duration: time.Second, Workload: SingleKey()},
		"no duration": {Addr: "127.0.0.1:1", Workload: SingleKey()},
		"no domain":   {Addr: "127.0.0.1:1", Duration: time.Second, Workload: Workload{Entries: []Entry{{"k", "v"}}}},
		"no entries":  {Addr: "127.0.0.1:1", Duration: time.Second, Workload: Workload{Domain: "d"}},
	} {
		if _, err := Run(t.Context(), cfg); err == nil {
			t.Errorf("%s: Run accepted %+v", name, cfg)
		}
	}
}

// TestRunUnreachable checks that a target that does not answer is an
// error up front, within the grace period, not a run made of errors.
func TestRunUnreachable(t *testing.T) {
	addr, stop, err := Serve(NoopServer{})
	if err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	_, err = Run(t.Context(), Config{Addr: addr, Duration: time.Second, Grace: 200 * time.Millisecond, Workload: SingleKey()})
	if err == nil {
		t.Fatal("Run against a stopped server succeeded")
	}
}
