package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Defaults for zero Config fields.
const (
	DefaultConcurrency = 64
	DefaultConns       = 4
	// DefaultGrace is how long calls still in flight when the run ends may
	// take to finish before they are cancelled (and counted as errors).
	DefaultGrace = 5 * time.Second
)

// Config describes one closed-loop load run: Concurrency workers, each
// sending its next request as soon as the previous is answered, over
// Conns gRPC connections, for Duration or Requests calls, whichever
// ends first.
type Config struct {
	// Addr is the target, host:port. The host must be a loopback address
	// or "localhost": this is a benchmark tool, not a way to load someone
	// else's service.
	Addr string
	// Concurrency is the number of workers; zero means DefaultConcurrency.
	Concurrency int
	// Conns is the number of gRPC connections (each its own HTTP/2
	// transport) the workers share round-robin; zero means DefaultConns.
	Conns int
	// Duration bounds the measured run; it is required.
	Duration time.Duration
	// Requests, when positive, also bounds the run by the number of calls.
	Requests int64
	// Warmup, when positive, runs the same load for this long first,
	// unmeasured, on the same connections.
	Warmup time.Duration
	// Grace bounds how long in-flight calls may take once the run ends;
	// zero means DefaultGrace.
	Grace time.Duration
	// Workload is what the requests carry.
	Workload Workload
}

// Result is the outcome of a measured run.
type Result struct {
	// Requests counts every call completed: answered or failed.
	Requests uint64
	// Errors counts failed calls (any gRPC error); FirstError is one.
	Errors     uint64
	FirstError error
	// OK and OverLimit count answers by overall code.
	OK, OverLimit uint64
	// Elapsed runs from the first call to the last answer.
	Elapsed time.Duration
	// Throughput is answered calls per second of Elapsed.
	Throughput float64
	// Latency quantiles and maximum of the answered calls, within 1.6%.
	P50, P99, P999, Max time.Duration
}

// Run dials cfg.Addr, checks that the target answers, and then drives the
// load described by cfg, returning what was measured. An error means the
// run could not start (bad config, nothing answering); failed calls during
// the run are counted in the Result instead. Cancelling ctx ends the run
// early.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.check(); err != nil {
		return Result{}, err
	}
	reqs, err := cfg.Workload.build()
	if err != nil {
		return Result{}, err
	}
	clients, closeConns, err := dial(cfg.Addr, cfg.Conns)
	if err != nil {
		return Result{}, err
	}
	defer closeConns()
	// One call per connection: connects them all before the clock starts
	// and turns a wrong address or domain into an error instead of a run
	// made only of errors.
	probeCtx, cancel := context.WithTimeout(ctx, cfg.Grace)
	defer cancel()
	for i, c := range clients {
		if _, err := c.ShouldRateLimit(probeCtx, reqs.reqs[0], grpc.WaitForReady(true)); err != nil {
			return Result{}, fmt.Errorf("first call on connection %d to %s: %w", i, cfg.Addr, err)
		}
	}
	if cfg.Warmup > 0 {
		warm := cfg
		warm.Duration, warm.Requests = cfg.Warmup, 0
		drive(ctx, warm, clients, reqs)
	}
	return drive(ctx, cfg, clients, reqs), nil
}

// check validates cfg and fills in the defaults.
func (cfg *Config) check() error {
	if cfg.Concurrency == 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.Conns == 0 {
		cfg.Conns = DefaultConns
	}
	if cfg.Grace == 0 {
		cfg.Grace = DefaultGrace
	}
	switch {
	case cfg.Concurrency < 0:
		return fmt.Errorf("concurrency %d: want at least 1", cfg.Concurrency)
	case cfg.Conns < 0:
		return fmt.Errorf("conns %d: want at least 1", cfg.Conns)
	case cfg.Duration <= 0:
		return fmt.Errorf("duration %v: want a positive bound on the run", cfg.Duration)
	case cfg.Requests < 0:
		return fmt.Errorf("requests %d: want 0 (no count bound) or more", cfg.Requests)
	case cfg.Grace < 0:
		return fmt.Errorf("grace %v: want a positive duration", cfg.Grace)
	}
	return checkLoopback(cfg.Addr)
}

// checkLoopback accepts host:port whose host is "localhost" or a loopback
// IP address.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("address %q: only loopback targets (127.0.0.0/8, ::1, localhost) are allowed", addr)
	}
	return nil
}

// dial opens n independent client connections to addr.
func dial(addr string, n int) ([]rlsv3.RateLimitServiceClient, func(), error) {
	conns := make([]*grpc.ClientConn, 0, n)
	closeAll := func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
	clients := make([]rlsv3.RateLimitServiceClient, n)
	for i := range n {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		conns = append(conns, c)
		clients[i] = rlsv3.NewRateLimitServiceClient(c)
	}
	return clients, closeAll, nil
}

// tally is one worker's counts. Each worker owns one, so the hot loop
// shares nothing but the optional request budget.
type tally struct {
	requests, errors, ok, over uint64
	firstErr                   error
	hist                       histogram
}

// drive runs the load of cfg and measures it.
func drive(ctx context.Context, cfg Config, clients []rlsv3.RateLimitServiceClient, reqs *requestSet) Result {
	// Calls run under a context that outlives the run by the grace period,
	// so the calls in flight when it ends are answered (and counted), not
	// cancelled; one deadline for the whole run rather than one per call
	// keeps timers out of the hot loop.
	callCtx, cancel := context.WithTimeout(ctx, cfg.Duration+cfg.Grace)
	defer cancel()
	var budget atomic.Int64
	budget.Store(cfg.Requests)
	tallies := make([]tally, cfg.Concurrency)

	// The clock starts before the timer so that Elapsed covers at least
	// Duration.
	start := time.Now()
	var stop atomic.Bool
	timer := time.AfterFunc(cfg.Duration, func() { stop.Store(true) })
	defer timer.Stop()
	unhook := context.AfterFunc(ctx, func() { stop.Store(true) })
	defer unhook()
	var wg sync.WaitGroup
	for w := range tallies {
		wg.Go(func() {
			t := &tallies[w]
			client := clients[w%len(clients)]
			rng := rand.New(rand.NewPCG(uint64(w), 0x5eed))
			for !stop.Load() {
				if cfg.Requests > 0 && budget.Add(-1) < 0 {
					return
				}
				req := reqs.pick(rng)
				t0 := time.Now()
				resp, err := client.ShouldRateLimit(callCtx, req)
				lat := time.Since(t0)
				t.requests++
				if err != nil {
					t.errors++
					if t.firstErr == nil {
						t.firstErr = err
					}
					continue
				}
				t.hist.record(lat)
				switch resp.GetOverallCode() {
				case rlsv3.RateLimitResponse_OK:
					t.ok++
				case rlsv3.RateLimitResponse_OVER_LIMIT:
					t.over++
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	r := Result{Elapsed: elapsed}
	var hist histogram
	for i := range tallies {
		t := &tallies[i]
		r.Requests += t.requests
		r.Errors += t.errors
		r.OK += t.ok
		r.OverLimit += t.over
		if r.FirstError == nil {
			r.FirstError = t.firstErr
		}
		hist.merge(&t.hist)
	}
	r.Throughput = float64(r.Requests-r.Errors) / elapsed.Seconds()
	r.P50, r.P99, r.P999 = hist.quantile(0.50), hist.quantile(0.99), hist.quantile(0.999)
	r.Max = time.Duration(hist.max)
	return r
}
