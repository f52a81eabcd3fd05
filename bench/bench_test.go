package bench

import (
	"context"
	"math"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/backend/redis"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
	"github.com/sluice-rl/sluice/ratelimit"
	"github.com/sluice-rl/sluice/telemetry"
)

// benchConcurrency is the number of goroutines the gRPC benchmarks run,
// the sluice-bench default: with RunParallel's default of one goroutine
// per P, two cores would keep only two calls in flight and measure
// latency, not what the server sustains.
const benchConcurrency = 64

// newMemory returns the Sluice service the benchmarks measure: RulesYAML
// on a memory backend with the TTL rules `sluice serve` applies by
// default, closed when tb ends.
func newMemory(tb testing.TB) *MemoryService {
	tb.Helper()
	m, err := NewMemoryService(RulesYAML, memory.Options{TTLMultiplier: backend.DefaultTTLMultiplier})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(m.Close)
	return m
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
		m := newMemory(b)
		benchGRPC(b, m.Service, m.ServerOptions...)
	})
}

func benchGRPC(b *testing.B, svc rlsv3.RateLimitServiceServer, opts ...grpc.ServerOption) {
	addr := serve(b, svc, opts...)
	conns, closeConns, err := dial([]string{addr}, DefaultConns)
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
	for _, c := range conns { // connect before the clock starts
		if _, err := c.client.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Uint32
	b.ReportAllocs()
	b.SetParallelism(max(1, benchConcurrency/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := conns[int(next.Add(1))%len(conns)].client
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
	benchDecide(b, newMemory(b).Service)
}

// BenchmarkServiceDecideRatelimitMetrics is BenchmarkServiceDecide with
// --ratelimit-metrics: what counting each descriptor under
// envoyproxy/ratelimit's names adds per call.
func BenchmarkServiceDecideRatelimitMetrics(b *testing.B) {
	m, err := NewMemoryServiceWith(RulesYAML, memory.Options{TTLMultiplier: backend.DefaultTTLMultiplier},
		telemetry.Options{TraceSampling: 0.01, RatelimitStats: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(m.Close)
	benchDecide(b, m.Service)
}

func benchDecide(b *testing.B, svc *ratelimit.Service) {
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
	m := newMemory(t)
	addr := serve(t, m.Service, m.ServerOptions...)
	for _, w := range []Workload{
		SingleKey(),
		{Domain: Domain, Entries: []Entry{{Key, "u"}}, Dist: Uniform, Keys: 100},
		{Domain: Domain, Entries: []Entry{{Key, "h"}}, Dist: Hot, Keys: 10, HotFraction: 0.5},
		{Domain: Domain, Entries: []Entry{{Key, "z"}}, Dist: Zipf, Keys: 100},
	} {
		t.Run(w.Dist.String(), func(t *testing.T) {
			r, err := Run(t.Context(), Config{
				Addrs: []string{addr}, Concurrency: 8, Conns: 2,
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
	r, err := Run(t.Context(), Config{Addrs: []string{addr}, Concurrency: 4, Conns: 1, Duration: time.Minute, Requests: 300, Workload: SingleKey()})
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != 300 || r.OK != 300 || r.Errors != 0 {
		t.Fatalf("%+v: want 300 calls, all OK", r)
	}
}

// An open loop sends calls at its rate, not as fast as they are
// answered: against a server that answers at once, 200 calls at 200/s
// take a second, every one of them is sent, and none is dropped. The run
// may last three seconds: the last call is due at 995 ms, and on a busy
// machine (a CI run, 55 of 200 calls late) it started after a
// one-second run had ended, and was dropped.
func TestRunOpenLoopKeepsItsPace(t *testing.T) {
	srv := &countingServer{}
	addr := serve(t, srv)
	const rate = 200
	r, err := Run(t.Context(), Config{Addrs: []string{addr}, Concurrency: 4, Conns: 1, Rate: rate, Requests: rate,
		Duration: 3 * time.Second, Workload: SingleKey()})
	if err != nil {
		t.Fatal(err)
	}
	if r.Scheduled != rate || r.Requests != rate || r.OK != rate || r.Dropped != 0 {
		t.Fatalf("%+v: want %d calls due, all sent and answered", r, rate)
	}
	if n := srv.calls.Load() - 1; n != rate { // less the connection's probe
		t.Fatalf("the server answered %d calls, want %d", n, rate)
	}
	// Call n is due at n/rate: a closed loop would be done in
	// milliseconds.
	if min := time.Duration(rate-1) * time.Second / rate; r.Elapsed < min {
		t.Fatalf("200 calls at %d/s took %v, want at least %v", rate, r.Elapsed, min)
	}
}

// When the target cannot keep up, an open loop charges it for the queue:
// a call's latency runs from when it was due, calls sent behind time
// count as late, and calls that came due while every worker was busy
// until the end count as dropped. One worker against a 50 ms server,
// 100 calls/s: about one in five is sent at all.
func TestRunOpenLoopChargesTheQueue(t *testing.T) {
	addr := serve(t, sleepyServer{delay: 50 * time.Millisecond})
	r, err := Run(t.Context(), Config{Addrs: []string{addr}, Concurrency: 1, Conns: 1, Rate: 100, Duration: 500 * time.Millisecond, Workload: SingleKey()})
	if err != nil {
		t.Fatal(err)
	}
	if r.Scheduled != 50 || r.Requests+r.Dropped != r.Scheduled || r.Requests > 11 || r.Dropped == 0 {
		t.Fatalf("%+v: want 50 calls due, at most 11 sent, the rest dropped", r)
	}
	if r.Late < r.Requests-1 {
		t.Fatalf("%d of %d calls late: every call but the first should be", r.Late, r.Requests)
	}
	// The last call sent was due near the start and answered near the
	// end: its latency is the queue's, far above the server's 50 ms.
	if r.Max < 250*time.Millisecond {
		t.Fatalf("slowest call %v: latency is not counted from when calls were due", r.Max)
	}
}

// TestRunCancel checks that cancelling the context ends a long run early.
func TestRunCancel(t *testing.T) {
	addr := serve(t, NoopServer{})
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := Run(ctx, Config{Addrs: []string{addr}, Concurrency: 2, Duration: time.Minute, Workload: SingleKey()}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("run took %v after its context ended", d)
	}
}

// Run refuses a bad config before it dials, naming what is wrong: each
// case below would otherwise fail only later, at the first call, for
// another reason.
func TestRunRejects(t *testing.T) {
	for name, c := range map[string]struct {
		cfg  Config
		want string
	}{
		"remote":      {Config{Addrs: []string{"192.0.2.1:8081"}, Duration: time.Second, Workload: SingleKey()}, "only loopback"},
		"no port":     {Config{Addrs: []string{"127.0.0.1"}, Duration: time.Second, Workload: SingleKey()}, "missing port"},
		"no duration": {Config{Addrs: []string{"127.0.0.1:1"}, Workload: SingleKey()}, "duration 0s"},
		"no domain":   {Config{Addrs: []string{"127.0.0.1:1"}, Duration: time.Second, Workload: Workload{Entries: []Entry{{"k", "v"}}}}, "empty domain"},
		"no entries":  {Config{Addrs: []string{"127.0.0.1:1"}, Duration: time.Second, Workload: Workload{Domain: "d"}}, "no descriptor entries"},
		"remote metrics": {Config{Addrs: []string{"127.0.0.1:1"}, Metrics: []string{"http://192.0.2.1:8080/metrics"}, Duration: time.Second, Workload: SingleKey()},
			"192.0.2.1"},
		"https metrics": {Config{Addrs: []string{"127.0.0.1:1"}, Metrics: []string{"https://127.0.0.1:8080/metrics"}, Duration: time.Second, Workload: SingleKey()},
			"https"},
		"one remote":       {Config{Addrs: []string{"127.0.0.1:1", "192.0.2.1:8081"}, Duration: time.Second, Workload: SingleKey()}, "only loopback"},
		"negative timeout": {Config{Addrs: []string{"127.0.0.1:1"}, Timeout: -time.Second, Duration: time.Second, Workload: SingleKey()}, "timeout -1s"},
		"negative rate":    {Config{Addrs: []string{"127.0.0.1:1"}, Rate: -1, Duration: time.Second, Workload: SingleKey()}, "rate -1"},
		"NaN rate":         {Config{Addrs: []string{"127.0.0.1:1"}, Rate: math.NaN(), Duration: time.Second, Workload: SingleKey()}, "rate NaN"},
		"no target":        {Config{Duration: time.Second, Workload: SingleKey()}, "no target address"},
		"negative series":  {Config{Addrs: []string{"127.0.0.1:1"}, Series: -time.Second, Duration: time.Second, Workload: SingleKey()}, "series -1s"},
		"too many windows": {Config{Addrs: []string{"127.0.0.1:1"}, Series: time.Millisecond, Duration: 2 * time.Second, Workload: SingleKey()}, "2000 windows"},
	} {
		if _, err := Run(t.Context(), c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Run(%+v) = %v, want an error naming %q", name, c.cfg, err, c.want)
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
	_, err = Run(t.Context(), Config{Addrs: []string{addr}, Duration: time.Second, Grace: 200 * time.Millisecond, Workload: SingleKey()})
	if err == nil {
		t.Fatal("Run against a stopped server succeeded")
	}
}

// countingServer is the do-nothing server counting its calls.
type countingServer struct {
	NoopServer
	calls atomic.Int64
}

func (s *countingServer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s.calls.Add(1)
	return s.NoopServer.ShouldRateLimit(ctx, req)
}

// TestRunTargets checks that a run spreads its calls over every target,
// about evenly, and counts every call a target answered.
func TestRunTargets(t *testing.T) {
	a, b := &countingServer{}, &countingServer{}
	addrs := []string{serve(t, a), serve(t, b)}
	r, err := Run(t.Context(), Config{Addrs: addrs, Concurrency: 8, Conns: 2, Duration: time.Minute, Requests: 600, Workload: SingleKey()})
	if err != nil {
		t.Fatal(err)
	}
	// Each connection's first call checks it: two per target.
	na, nb := a.calls.Load()-2, b.calls.Load()-2
	if r.Requests != 600 || r.OK != 600 || uint64(na+nb) != r.Requests {
		t.Fatalf("%+v; targets answered %d and %d: want 600 calls, all OK, all counted", r, na, nb)
	}
	// Four workers per target, closed loops of the same speed.
	if na < 150 || nb < 150 {
		t.Fatalf("targets answered %d and %d of 600 calls: want both a fair share", na, nb)
	}
}

// sleepyServer answers after a delay, or fails when the call's context
// ends first, as a server behind a slow backend does.
type sleepyServer struct {
	NoopServer
	delay time.Duration
}

func (s sleepyServer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	select {
	case <-time.After(s.delay):
		return s.NoopServer.ShouldRateLimit(ctx, req)
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// TestRunTimeout checks that the per-call deadline is each call's own:
// against a server slower than it, every call of the run fails with
// DeadlineExceeded and is counted by that code.
func TestRunTimeout(t *testing.T) {
	addr := serve(t, sleepyServer{delay: 200 * time.Millisecond})
	r, err := Run(t.Context(), Config{Addrs: []string{addr}, Concurrency: 4, Conns: 1, Duration: 150 * time.Millisecond,
		Timeout: 10 * time.Millisecond, Workload: SingleKey()})
	if err != nil {
		t.Fatal(err)
	}
	// Fifteen 10ms deadlines fit in 150ms for each worker; a whole-run
	// deadline would have given one slow answer each, or none.
	if r.Requests < 4*5 || r.Errors != r.Requests || r.OK != 0 {
		t.Fatalf("%+v: want many calls, all failed", r)
	}
	if n := r.ErrorCodes[codes.DeadlineExceeded]; n != r.Errors || len(r.ErrorCodes) != 1 || r.PastDeadline != n {
		t.Fatalf("errors by code %v of %d, %d past the deadline: want all DeadlineExceeded", r.ErrorCodes, r.Errors, r.PastDeadline)
	}
}

// TestRunMetrics drives Sluice (memory backend) with a served /metrics
// page, the real one, and checks that the backend decisions the page
// counted over the run are the calls answered in it: no more (the probe
// and warmup calls are outside), no fewer.
func TestRunMetrics(t *testing.T) {
	m := newMemory(t)
	addr := serve(t, m.Service, m.ServerOptions...)
	page := httptest.NewServer(m.Metrics)
	t.Cleanup(page.Close)
	w := SingleKey()
	w.Over, w.OverFraction = []Entry{{OverKey, "x"}}, 0.2
	r, err := Run(t.Context(), Config{Addrs: []string{addr}, Metrics: []string{page.URL + "/metrics"}, Concurrency: 4, Conns: 1,
		Duration: time.Minute, Requests: 500, Warmup: 20 * time.Millisecond, Workload: w})
	if err != nil {
		t.Fatal(err)
	}
	u := r.Usage
	switch {
	case u == nil:
		t.Fatal("no usage with a metrics URL")
	case r.Requests != 500 || r.Errors != 0:
		t.Fatalf("%+v: want 500 calls, no errors", r)
	case r.OverLimit == 0 || r.OK == 0:
		t.Fatalf("%d OK, %d over limit: want both", r.OK, r.OverLimit)
	case u.Pages != 1 || u.Decisions != float64(r.OK+r.OverLimit):
		t.Fatalf("%d page(s), %v backend decisions; want 1 page, %d (the answered calls)", u.Pages, u.Decisions, r.OK+r.OverLimit)
	case u.DynamoDBCalls != 0 || u.WriteUnits != nil || u.LocalAnswers != nil:
		t.Fatalf("memory backend with DynamoDB usage: %+v", u)
	}
}

// TestRunRedis drives Sluice on the Redis backend (a real redis-server)
// with its /metrics, as compare mode does, and checks the driver's
// reading of it, not performance: every call is answered OK, each is one
// redis decision, each decision is at most one script run (fewer when
// decisions on one key share a run), the keys' config reads are HGETALL
// round trips, and the backend's own Stats agree with the counters.
func TestRunRedis(t *testing.T) {
	srv := redistest.Require(t)
	client, err := redis.Dial(t.Context(), redis.Conn{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	rs, err := NewRedisService(RulesYAML, client, redis.Options{TTLMultiplier: backend.DefaultTTLMultiplier})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Close)
	addr := serve(t, rs.Service, rs.ServerOptions...)
	page := httptest.NewServer(rs.Metrics)
	t.Cleanup(page.Close)
	r, err := Run(t.Context(), Config{Addrs: []string{addr}, Metrics: []string{page.URL + "/metrics"}, Concurrency: 4, Conns: 1,
		Duration: time.Minute, Requests: 400, Workload: Workload{Domain: Domain, Entries: []Entry{{Key, "r"}}, Dist: Uniform, Keys: 50}})
	if err != nil {
		t.Fatal(err)
	}
	u := r.Usage
	scripts, trips := u.BackendCallsByOp[OpEvalSHA], u.BackendCallsByOp[OpHGetAll]
	switch {
	case r.Requests != 400 || r.Errors != 0 || r.OK != 400:
		t.Fatalf("%+v: want 400 calls, all OK", r)
	case u.Backend != BackendRedis || u.Decisions != 400:
		t.Fatalf("usage %+v: want 400 redis decisions", u)
	case scripts < 1 || scripts > 400 || trips < 1 || u.BackendCalls != scripts+trips:
		t.Fatalf("round trips %v: want 1 to 400 script runs and some config reads, nothing else", u.BackendCallsByOp)
	case u.ConfigCacheMisses == nil || *u.ConfigCacheMisses < trips || *u.ConfigCacheMisses > 4*50:
		// Every read follows a miss, and each of the 4 callers may miss
		// each of the 50 keys once, waiting on one read.
		t.Fatalf("config cache misses %v for %v reads of 50 keys", orNil(u.ConfigCacheMisses), trips)
	}
	// The probe call is outside the run: the Stats count it too.
	if st := rs.Backend.Stats(); st.Scripts.Load() < uint64(scripts) || st.Scripts.Load() > uint64(scripts)+1 || st.ScriptErrors.Load() != 0 {
		t.Fatalf("Stats: %d script runs (%d failed), the metrics %v over the run and the probe's", st.Scripts.Load(), st.ScriptErrors.Load(), scripts)
	}
}

// orNil is *v for a message, or nil.
func orNil(v *float64) any {
	if v == nil {
		return nil
	}
	return *v
}
