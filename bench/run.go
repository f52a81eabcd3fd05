package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Defaults for zero Config fields.
const (
	DefaultConcurrency = 64
	DefaultConns       = 4
	// DefaultGrace is how long calls still in flight when the run ends may
	// take to finish before they are cancelled (and counted as errors).
	DefaultGrace = 5 * time.Second
	// LateAfter is how far behind its slot an open-loop call may start
	// before it counts as late: past a timer's wake-up jitter, so a late
	// call means every caller was busy (the target did not keep up) or
	// the load generator itself fell behind.
	LateAfter = time.Millisecond
)

// Config describes one load run over Conns gRPC connections to each of
// Addrs, for Duration or Requests calls, whichever ends first. Without a
// Rate it is a closed loop: Concurrency workers, each sending its next
// request as soon as the previous is answered. With a Rate it is an open
// loop: calls are due at a steady pace whatever the answers do, and
// Concurrency bounds how many are in flight.
type Config struct {
	// Addrs are the targets, host:port, such as the replicas of one
	// fleet. Each host must be a loopback address or "localhost": this is
	// a benchmark tool, not a way to load someone else's service.
	Addrs []string
	// Concurrency is the number of workers; zero means DefaultConcurrency.
	// In an open loop it is the most calls in flight at once.
	Concurrency int
	// Rate, when positive, makes the run an open loop: call n is due at
	// n/Rate seconds after the start, and its latency runs from then, not
	// from when a worker got to it, so a target that falls behind is
	// charged for the queue it built (no coordinated omission). Zero
	// means a closed loop.
	Rate float64
	// Conns is the number of gRPC connections (each its own HTTP/2
	// transport) per target; zero means DefaultConns. The connections to
	// all targets are interleaved and the workers take them round-robin,
	// so that each target gets an equal share of the workers (give or
	// take one).
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
	// Timeout, when positive, is the deadline of each call, as Envoy sets
	// its filter's timeout (20ms by default) on each of its calls. A call
	// past it fails with DeadlineExceeded.
	Timeout time.Duration
	// Metrics are URLs of Sluice's /metrics, one per replica, scraped
	// right before and right after the measured run; Result.Usage is
	// what the counters moved by in between. Like Addrs, they must be on
	// loopback.
	Metrics []string
	// Workload is what the requests carry.
	Workload Workload
	// Series, when positive, also records the measured run in windows
	// of this length from its first call (Result.Series), and with
	// Metrics scrapes every page at each window boundary, so that each
	// window has what the backend did in it. Duration may make at most
	// MaxWindows windows.
	Series time.Duration
	// Prime, when true, sends one call to each target before the warmup,
	// all at once, each with no deadline, and waits for every answer
	// (Result.Prime): the workload's first request (its first key), so
	// that every replica has read the key's config and seen its bucket
	// before the measured calls, with their deadlines, arrive. The
	// calls count in no total of the run; what they were answered is in
	// Result.Prime.
	Prime bool
}

// Result is the outcome of a measured run.
type Result struct {
	// Requests counts every call completed: answered or failed.
	Requests uint64
	// Errors counts failed calls (any gRPC error); FirstError is one.
	Errors     uint64
	FirstError error
	// ErrorCodes counts the failed calls by gRPC code.
	ErrorCodes map[codes.Code]uint64
	// OK and OverLimit count answers by overall code.
	OK, OverLimit uint64
	// Open loop only: Scheduled counts the calls that came due during
	// the run; Late those sent more than LateAfter after they were due
	// (all workers busy, or the generator's own timers woke late);
	// Dropped those never sent because every worker was busy until the
	// run ended (Scheduled - Requests). Latency includes the lateness.
	Scheduled, Late, Dropped uint64
	// Start is when the run's first call was sent; Elapsed runs from
	// then to the last answer.
	Start   time.Time
	Elapsed time.Duration
	// PastDeadline counts the failed calls whose deadline passed first
	// (DeadlineExceeded; with Config.Timeout, each call's own).
	PastDeadline uint64
	// Throughput is answered calls per second of Elapsed.
	Throughput float64
	// Latency quantiles and maximum of the answered calls, within 1.6%.
	P50, P99, P999, Max time.Duration
	// Usage is what the backend did during the run, from Sluice's
	// metrics; nil without Config.Metrics.
	Usage *Usage
	// Series is the run in windows (Config.Series); nil without.
	Series []Window
	// Prime is what the priming calls were answered (Config.Prime); nil
	// without.
	Prime *Prime
}

// Prime is the outcome of the priming calls (Config.Prime): one per
// target, each with no deadline.
type Prime struct {
	// Calls is the number of calls, one per target; OK and OverLimit
	// count their answers.
	Calls, OK, OverLimit uint64
	// Took runs from when the calls were sent to the last answer; Lead
	// from then to the first call of the measured run (Took, any warmup,
	// and the scrape before the run). A bound on what a key admits from
	// its first call counts Lead + Result.Elapsed, and OK besides the
	// run's.
	Took, Lead time.Duration
}

// Run dials every target, checks that each answers, and then drives the
// load described by cfg, returning what was measured. An error means the
// run could not start (bad config, nothing answering) or its metrics
// could not be read; failed calls during the run are counted in the
// Result instead. Cancelling ctx ends the run early.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.check(); err != nil {
		return Result{}, err
	}
	reqs, err := cfg.Workload.build()
	if err != nil {
		return Result{}, err
	}
	conns, closeConns, err := dial(cfg.Addrs, cfg.Conns)
	if err != nil {
		return Result{}, err
	}
	defer closeConns()
	// One call per connection: connects them all before the clock starts
	// and turns a wrong address into an error instead of a run made only
	// of errors. The call carries a descriptor no rule matches
	// (ProbeKey), so it touches none of the workload's buckets: a run
	// without warmup starts on keys as new as they were.
	probeCtx, cancel := context.WithTimeout(ctx, cfg.Grace)
	defer cancel()
	for i, c := range conns {
		if _, err := c.client.ShouldRateLimit(probeCtx, reqs.probe, grpc.WaitForReady(true)); err != nil {
			return Result{}, fmt.Errorf("first call on connection %d to %s: %w", i, c.addr, err)
		}
	}
	var primed *Prime
	var primeStart time.Time
	if cfg.Prime {
		primeStart = time.Now()
		if primed, err = prime(ctx, conns[:len(cfg.Addrs)], reqs.reqs[0]); err != nil {
			return Result{}, err
		}
	}
	if cfg.Warmup > 0 {
		warm := cfg
		warm.Duration, warm.Requests = cfg.Warmup, 0
		drive(ctx, warm, conns, reqs, nil)
	}
	var sc *scraper
	var before Snapshot
	if len(cfg.Metrics) > 0 {
		sc = newScraper(cfg.Metrics)
		// No call is in flight now (drive returns when all are
		// answered), so the two scrapes bracket the measured calls
		// exactly.
		if before, err = sc.scrape(ctx); err != nil {
			return Result{}, fmt.Errorf("before the run: %w", err)
		}
	}
	var s *series
	if cfg.Series > 0 {
		s = newSeries(cfg, sc, before)
	}
	r := drive(ctx, cfg, conns, reqs, s)
	if primed != nil {
		primed.Lead = r.Start.Sub(primeStart)
		r.Prime = primed
	}
	var after *Snapshot
	var afterAt time.Duration
	if sc != nil {
		// The run's context may have ended the run; the last scrape still
		// has to happen for the result to mean anything.
		afterAt = time.Since(r.Start)
		snap, err := sc.scrape(context.WithoutCancel(ctx))
		if err != nil {
			if s != nil {
				r.Series = s.result(r.Elapsed, nil, 0, len(cfg.Metrics))
			}
			return r, fmt.Errorf("after the run: %w", err)
		}
		after = &snap
		u := after.Sub(before).Usage(r.OK, r.OverLimit)
		u.Pages = len(cfg.Metrics)
		r.Usage = &u
	}
	if s != nil {
		r.Series = s.result(r.Elapsed, after, afterAt, len(cfg.Metrics))
	}
	return r, nil
}

// prime sends one call of req on each of conns, all at once and each
// with no deadline, and waits for every answer. A failed call fails the
// run: the fleet is not ready for it.
func prime(ctx context.Context, conns []conn, req *rlsv3.RateLimitRequest) (*Prime, error) {
	start := time.Now()
	resps := make([]*rlsv3.RateLimitResponse, len(conns))
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() { resps[i], errs[i] = c.client.ShouldRateLimit(ctx, req) })
	}
	wg.Wait()
	p := &Prime{Calls: uint64(len(conns)), Took: time.Since(start)}
	for i, resp := range resps {
		if errs[i] != nil {
			return nil, fmt.Errorf("priming call to %s: %w", conns[i].addr, errs[i])
		}
		switch resp.GetOverallCode() {
		case rlsv3.RateLimitResponse_OK:
			p.OK++
		case rlsv3.RateLimitResponse_OVER_LIMIT:
			p.OverLimit++
		}
	}
	return p, nil
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
	case len(cfg.Addrs) == 0:
		return errors.New("no target address")
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
	case cfg.Timeout < 0:
		return fmt.Errorf("timeout %v: want 0 (none) or a positive duration", cfg.Timeout)
	case !(cfg.Rate >= 0) || math.IsInf(cfg.Rate, 1):
		return fmt.Errorf("rate %v: want 0 (closed loop) or a finite number of calls per second", cfg.Rate)
	case cfg.Series < 0:
		return fmt.Errorf("series %v: want 0 (none) or a positive window", cfg.Series)
	case cfg.Series > 0 && numWindows(cfg.Duration, cfg.Series) > MaxWindows:
		return fmt.Errorf("series %v: %d windows over %v, more than %d", cfg.Series, numWindows(cfg.Duration, cfg.Series), cfg.Duration, MaxWindows)
	}
	for _, addr := range cfg.Addrs {
		if err := checkLoopbackAddr(addr); err != nil {
			return err
		}
	}
	for _, u := range cfg.Metrics {
		if err := checkMetricsURL(u); err != nil {
			return err
		}
	}
	return nil
}

// checkLoopbackAddr accepts host:port whose host is loopback.
func checkLoopbackAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	if !isLoopback(host) {
		return fmt.Errorf("address %q: only loopback targets (127.0.0.0/8, ::1, localhost) are allowed", addr)
	}
	return nil
}

// isLoopback reports whether host is "localhost" or a loopback IP address.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// conn is one client connection and the target it goes to.
type conn struct {
	addr   string
	client rlsv3.RateLimitServiceClient
}

// dial opens n independent client connections to each of addrs,
// interleaved: connection i goes to addrs[i%len(addrs)].
func dial(addrs []string, n int) ([]conn, func(), error) {
	ccs := make([]*grpc.ClientConn, 0, n*len(addrs))
	closeAll := func() {
		for _, c := range ccs {
			_ = c.Close()
		}
	}
	conns := make([]conn, n*len(addrs))
	for i := range conns {
		addr := addrs[i%len(addrs)]
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		ccs = append(ccs, cc)
		conns[i] = conn{addr: addr, client: rlsv3.NewRateLimitServiceClient(cc)}
	}
	return conns, closeAll, nil
}

// numCodes bounds the gRPC codes counted one by one; any other code
// counts as Unknown.
const numCodes = int(codes.Unauthenticated) + 1

// tally is one worker's counts. Each worker owns one, so the hot loop
// shares nothing but the optional request budget.
type tally struct {
	requests, errors, ok, over uint64
	late                       uint64
	codes                      [numCodes]uint64
	firstErr                   error
	hist                       histogram
}

func (t *tally) failed(err error) {
	t.errors++
	if t.firstErr == nil {
		t.firstErr = err
	}
	c := status.Code(err)
	if int(c) >= numCodes {
		c = codes.Unknown
	}
	t.codes[c]++
}

// call makes one call, with its own deadline when timeout is positive,
// and counts its outcome, in s's window too when there is a series. Its
// latency runs from due: when it was sent in a closed loop, when it was
// scheduled in an open one, where late says it was sent behind time.
func (t *tally) call(ctx context.Context, client rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest, timeout time.Duration, due time.Time, late bool, s *series) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	resp, err := client.ShouldRateLimit(ctx, req)
	now := time.Now()
	lat := now.Sub(due)
	t.requests++
	if late {
		t.late++
	}
	if err != nil {
		t.failed(err)
		if s != nil {
			s.record(now, lat, err, false, false, late)
		}
		return
	}
	t.hist.record(lat)
	code := resp.GetOverallCode()
	switch code {
	case rlsv3.RateLimitResponse_OK:
		t.ok++
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		t.over++
	}
	if s != nil {
		s.record(now, lat, nil, code == rlsv3.RateLimitResponse_OK, code == rlsv3.RateLimitResponse_OVER_LIMIT, late)
	}
}

// drive runs the load of cfg and measures it, in windows too with s.
func drive(ctx context.Context, cfg Config, conns []conn, reqs *requestSet, s *series) Result {
	// Calls run under a context that outlives the run by the grace period,
	// so the calls in flight when it ends are answered (and counted), not
	// cancelled. Without a per-call timeout, one deadline for the whole
	// run keeps timers out of the hot loop.
	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration+cfg.Grace)
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
	if s != nil {
		s.start = start
		go s.scrapeLoop(ctx)
	}
	// An open loop's slots: slot n is due at start + n*interval. Workers
	// take them in order, so a slot nobody took is one that came due
	// while every worker was busy.
	var slots atomic.Int64
	var due int64 // slots due within Duration (or Requests)
	var interval float64
	if cfg.Rate > 0 {
		interval = float64(time.Second) / cfg.Rate
		due = int64(math.Ceil(cfg.Duration.Seconds() * cfg.Rate))
		if cfg.Requests > 0 {
			due = min(due, cfg.Requests)
		}
	}
	var wg sync.WaitGroup
	for w := range tallies {
		wg.Go(func() {
			t := &tallies[w]
			client := conns[w%len(conns)].client
			p := reqs.picker(uint64(w))
			if cfg.Rate > 0 {
				for !stop.Load() {
					n := slots.Add(1) - 1
					if n >= due {
						return
					}
					at := start.Add(time.Duration(float64(n) * interval))
					if wait := time.Until(at); wait > 0 {
						time.Sleep(wait)
					}
					if stop.Load() {
						return
					}
					t.call(runCtx, client, p.next(), cfg.Timeout, at, time.Since(at) > LateAfter, s)
				}
				return
			}
			for !stop.Load() {
				if cfg.Requests > 0 && budget.Add(-1) < 0 {
					return
				}
				t.call(runCtx, client, p.next(), cfg.Timeout, time.Now(), false, s)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if s != nil {
		close(s.done)
		<-s.scraped
	}

	r := Result{Start: start, Elapsed: elapsed}
	if cfg.Rate > 0 {
		// A run cut short (ctx) schedules only the slots that came due.
		r.Scheduled = uint64(min(due, int64(elapsed.Seconds()*cfg.Rate)+1))
	}
	var hist histogram
	var byCode [numCodes]uint64
	for i := range tallies {
		t := &tallies[i]
		r.Requests += t.requests
		r.Errors += t.errors
		r.OK += t.ok
		r.OverLimit += t.over
		r.Late += t.late
		if r.FirstError == nil {
			r.FirstError = t.firstErr
		}
		for c, n := range t.codes {
			byCode[c] += n
		}
		hist.merge(&t.hist)
	}
	r.PastDeadline = byCode[codes.DeadlineExceeded]
	if r.Errors > 0 {
		r.ErrorCodes = make(map[codes.Code]uint64)
		for c, n := range byCode {
			if n > 0 {
				r.ErrorCodes[codes.Code(c)] = n
			}
		}
	}
	if r.Scheduled > r.Requests {
		r.Dropped = r.Scheduled - r.Requests
	}
	r.Throughput = float64(r.Requests-r.Errors) / elapsed.Seconds()
	r.P50, r.P99, r.P999 = hist.quantile(0.50), hist.quantile(0.99), hist.quantile(0.999)
	r.Max = time.Duration(hist.max)
	return r
}
