// Command sluice-bench is Sluice's load generator.
//
// By default (compare mode) it measures what Sluice costs on top of gRPC:
// it starts, in this process and on loopback, a do-nothing
// RateLimitService and a Sluice service on the memory backend, both
// registered the same way on the same gRPC stack, and drives them with the
// same closed-loop load in alternating rounds. It reports each round, the
// medians, and the ratio of median throughputs, memory/noop. Rounds
// alternate which server goes first (noop first in odd rounds, memory
// first in even ones) so that drift in a noisy machine's speed does not
// favour one side. With -redis (a redis-server it starts) or -redis-url,
// a third server joins the rounds: Sluice on the Redis backend, built as
// the memory one is, with the same rules; the order is then noop, memory,
// redis in odd rounds and the reverse in even ones, and the report adds
// the ratios redis/memory and redis/noop and Redis round trips per
// decision. -redis-delay puts a proxy holding every round trip for that
// long in front of Redis, which on loopback is closer than any real one.
//
// With -addr it drives an already running Sluice (such as `sluice serve`,
// or several replicas of it sharing one DynamoDB table) instead, with the
// domain and descriptor given, and prints the result. With -metrics it
// also reads the replicas' /metrics before and after the run and reports
// what the backend did: decisions, DynamoDB calls, capacity units, and
// those per decision. Only loopback targets are accepted.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/backend/redis"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
	"github.com/sluice-rl/sluice/bench"
	"github.com/sluice-rl/sluice/internal/faultproxy"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// options are the command line.
type options struct {
	args               []string
	addrs, metrics     []string
	domain             string
	entries, over      []bench.Entry
	overLimit          float64
	rounds             int
	concurrency, conns int
	rate               float64
	keys               int
	dist               bench.Distribution
	hot, zipfS         float64
	duration, warmup   time.Duration
	timeout            time.Duration
	requests           int64
	// series is the window of the time series (-series); prime and
	// fresh are -prime and -fresh.
	series                 time.Duration
	prime, fresh           bool
	json                   bool
	cpuProfile, memProfile string
	// Compare mode's Redis side: a redis-server of its own (redis), or
	// the one at redisURL; redisDelay added to each round trip.
	redis      bool
	redisURL   string
	redisDelay time.Duration
	// redisCoalesce is serve's --coalesce-writes for the Redis side.
	redisCoalesce bool
}

// withRedis reports whether compare mode runs the Redis side.
func (o options) withRedis() bool { return o.redis || o.redisURL != "" }

// run executes the command line and returns the exit code: 0 done, 1 an
// error, 2 a bad command line.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "sluice-bench:", err)
		return 2
	}
	out := output{text: stdout}
	if o.json {
		// stdout carries only the records, for a script; the report
		// stays readable on the terminal.
		out = output{text: stderr, json: json.NewEncoder(stdout)}
	}
	if err := o.execute(ctx, out); err != nil {
		fmt.Fprintln(stderr, "sluice-bench:", err)
		return 1
	}
	return 0
}

// output is where the report goes: text always, and with -json one JSON
// record per run.
type output struct {
	text io.Writer
	json *json.Encoder
}

// entryFlag appends key=value entries to *dst.
func entryFlag(dst *[]bench.Entry) func(string) error {
	return func(s string) error {
		e, err := bench.ParseEntry(s)
		if err == nil {
			*dst = append(*dst, e)
		}
		return err
	}
}

// listFlag sets *dst to a comma-separated list.
func listFlag(dst *[]string) func(string) error {
	return func(s string) error {
		*dst = nil
		for part := range strings.SplitSeq(s, ",") {
			if part = strings.TrimSpace(part); part == "" {
				return fmt.Errorf("empty item in list %q", s)
			}
			*dst = append(*dst, part)
		}
		return nil
	}
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{args: args, dist: bench.Fixed}
	fs := flag.NewFlagSet("sluice-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage:
  sluice-bench [flags]              compare a do-nothing server and Sluice (memory backend), in process
  sluice-bench -redis | -redis-url redis://HOST:PORT [-redis-delay D] [flags]
                                    the same with Sluice on the Redis backend as a third server
  sluice-bench -addr HOST:PORT[,HOST:PORT...] -domain D -descriptor K=V [-metrics URL[,URL...]] [flags]
                                    drive a running Sluice (one or more replicas) on loopback

Each run is a closed loop: -concurrency workers over -conns gRPC
connections per target, each sending its next ShouldRateLimit call as soon
as the last is answered, for -duration after -warmup. With -rate it is an
open loop instead: calls are due at a steady pace, at most -concurrency in
flight, and each call's latency runs from when it was due.

Flags:
`)
		fs.PrintDefaults()
	}
	fs.Func("addr", "drive the Sluice replicas at these loopback `host:port`s (comma-separated) instead of comparing in process", listFlag(&o.addrs))
	fs.Func("metrics", "with -addr: the replicas' loopback /metrics `URLs` (comma-separated), read before and after the run", listFlag(&o.metrics))
	fs.StringVar(&o.domain, "domain", "", "with -addr: the request domain")
	fs.Func("descriptor", "with -addr: a `key=value` entry of the one descriptor sent; repeat for more entries, in order", entryFlag(&o.entries))
	fs.Func("over-descriptor", "a `key=value` entry of the descriptor the -over-limit share of calls carries instead; repeat for more entries (compare mode: "+bench.OverKey+"=x)", entryFlag(&o.over))
	fs.Float64Var(&o.overLimit, "over-limit", 0, "share of calls, 0 to 1, that carry -over-descriptor, which the rules give a tiny limit")
	fs.IntVar(&o.rounds, "rounds", 5, "compare mode: rounds, each running both servers")
	fs.IntVar(&o.concurrency, "concurrency", bench.DefaultConcurrency, "concurrent callers (goroutines); with -rate, the most calls in flight")
	fs.Float64Var(&o.rate, "rate", 0, "with -addr: an open loop offering this many `calls/s` at a steady pace; 0 for a closed loop")
	fs.IntVar(&o.conns, "conns", bench.DefaultConns, "gRPC connections per target; the callers take all of them round-robin")
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "measured time per run (per server per round)")
	fs.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "unmeasured load before each run; 0 for none")
	fs.DurationVar(&o.timeout, "timeout", 0, "deadline of each call, as Envoy's filter timeout (20ms by default); 0 for none")
	fs.Int64Var(&o.requests, "requests", 0, "also end each run after this many calls; 0 for no count bound")
	fs.DurationVar(&o.series, "series", 0, "with -addr: also report the measured run in windows this `long` from its first call (calls, answers, errors, latency, and with -metrics the backend's writes and calls, scraped at each window boundary); 0 for none")
	fs.BoolVar(&o.prime, "prime", false, "with -addr: before the warmup, send one call (the first key) with no deadline to each target, all at once, and wait for the answers")
	fs.BoolVar(&o.fresh, "fresh", false, "with -addr: append a value unique to this run to the last -descriptor entry's value, so that the run's keys are new to the fleet")
	fs.IntVar(&o.keys, "keys", 1, "distinct descriptor values (the last entry's value gets -0, -1, ... appended); with 1, one fixed value")
	fs.Func("dist", "how calls spread over -keys: `fixed|uniform|hot|zipf` (default fixed, uniform when -keys > 1)", func(s string) error {
		d, err := bench.ParseDistribution(s)
		o.dist = d
		return err
	})
	fs.Float64Var(&o.hot, "hot", bench.DefaultHotFraction, "with -dist hot: share of calls sent to the hot key")
	fs.Float64Var(&o.zipfS, "zipf-s", bench.DefaultZipfS, "with -dist zipf: the exponent s, above 1; key k (k = 1 the hottest) gets calls in proportion to k^-s")
	fs.BoolVar(&o.json, "json", false, "print one JSON object per run on stdout (the report goes to stderr)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to `file`")
	fs.StringVar(&o.memProfile, "memprofile", "", "write an allocation profile at the end to `file`")
	fs.BoolVar(&o.redis, "redis", false, "compare mode: also run Sluice on the Redis backend, on a redis-server started for the run (in memory)")
	fs.StringVar(&o.redisURL, "redis-url", "", "compare mode: also run Sluice on the Redis backend, on the Redis at this loopback redis://host:port `URL` (keys under the prefix "+redisPrefix+")")
	fs.BoolVar(&o.redisCoalesce, "redis-coalesce", true, "with -redis or -redis-url: decisions that arrive while the script runs share its next run, as serve's --coalesce-writes; false for one run per decision")
	fs.DurationVar(&o.redisDelay, "redis-delay", 0, "with -redis or -redis-url: latency added to every Redis round trip by a proxy in front of it (real Redis is 0.2 to 1 ms away in a region)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["dist"] && o.keys > 1 {
		o.dist = bench.Uniform
	}
	driving := len(o.addrs) > 0
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case driving && (o.domain == "" || len(o.entries) == 0):
		return o, errors.New("-addr needs -domain and at least one -descriptor key=value")
	case !driving && (set["domain"] || set["descriptor"] || set["over-descriptor"]):
		return o, errors.New("-domain, -descriptor and -over-descriptor go with -addr; compare mode sends its own benchmark rules' descriptors")
	case !driving && set["metrics"]:
		return o, errors.New("-metrics goes with -addr")
	case !driving && (set["series"] || set["prime"] || set["fresh"]):
		return o, errors.New("-series, -prime and -fresh go with -addr")
	case set["series"] && o.series <= 0:
		return o, fmt.Errorf("-series %v: want a positive window, such as 1s", o.series)
	case o.series > 0 && (o.duration+o.series-1)/o.series > bench.MaxWindows:
		return o, fmt.Errorf("-series %v: %v makes more than %d windows", o.series, o.duration, bench.MaxWindows)
	case driving && set["rounds"]:
		return o, errors.New("-rounds is for compare mode; with -addr there is one run")
	case o.rounds < 1:
		return o, fmt.Errorf("-rounds %d: want at least 1", o.rounds)
	case o.concurrency < 1 || o.conns < 1 || o.keys < 1:
		return o, errors.New("-concurrency, -conns and -keys must be at least 1")
	case !(o.rate >= 0) || math.IsInf(o.rate, 1):
		return o, fmt.Errorf("-rate %v: want 0 (a closed loop) or a finite number of calls per second", o.rate)
	case !driving && o.rate > 0:
		return o, errors.New("-rate goes with -addr: compare mode measures what each server sustains, in a closed loop")
	case o.duration <= 0:
		return o, fmt.Errorf("-duration %v: want a positive duration", o.duration)
	case o.timeout < 0:
		return o, fmt.Errorf("-timeout %v: want 0 (none) or a positive duration", o.timeout)
	case o.hot < 0 || o.hot > 1:
		return o, fmt.Errorf("-hot %v: want a share from 0 to 1", o.hot)
	case !(o.zipfS > 1):
		return o, fmt.Errorf("-zipf-s %v: want an exponent above 1", o.zipfS)
	case !(o.overLimit >= 0 && o.overLimit <= 1):
		return o, fmt.Errorf("-over-limit %v: want a share from 0 to 1", o.overLimit)
	case driving && (o.withRedis() || set["redis-delay"] || set["redis-coalesce"]):
		return o, errors.New("-redis, -redis-url, -redis-delay and -redis-coalesce are for compare mode; with -addr, start the replicas on Redis (bench/fleet.sh with BACKEND=redis)")
	case o.redis && o.redisURL != "":
		return o, errors.New("-redis starts a redis-server and -redis-url names one: one or the other")
	case (set["redis-delay"] || set["redis-coalesce"]) && !o.withRedis():
		return o, errors.New("-redis-delay and -redis-coalesce go with -redis or -redis-url")
	case o.redisDelay < 0:
		return o, fmt.Errorf("-redis-delay %v: want 0 or more", o.redisDelay)
	case driving && o.overLimit > 0 && len(o.over) == 0:
		return o, errors.New("-over-limit needs -over-descriptor key=value: a descriptor the rules give a tiny limit")
	}
	if o.redisURL != "" {
		if _, err := redisHostPort(o.redisURL); err != nil {
			return o, fmt.Errorf("-redis-url: %w", err)
		}
	}
	if !driving && o.overLimit > 0 {
		o.over = []bench.Entry{{Key: bench.OverKey, Value: "x"}}
	}
	if o.fresh {
		// Nanoseconds since 1970 in base 36: unique to this run on this
		// machine, and short.
		o.entries[len(o.entries)-1].Value += "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	return o, nil
}

// redisPrefix is the key prefix of compare mode's Redis side, so that
// its buckets stay apart from a deployment's (sluice) on a shared Redis.
const redisPrefix = "sluice-bench"

// redisHostPort is the host:port of a redis:// URL on loopback: the only
// kind compare mode drives, and the kind a proxy can stand in front of.
func redisHostPort(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", errors.New("not a URL") // url.Error would repeat a password
	}
	if u.Scheme != "redis" || u.Port() == "" || u.Opaque != "" {
		return "", fmt.Errorf("%s: want redis://host:port", u.Redacted())
	}
	if h := u.Hostname(); !(strings.EqualFold(h, "localhost") || net.ParseIP(h).IsLoopback()) {
		return "", fmt.Errorf("%s: only loopback hosts (127.0.0.0/8, ::1, localhost) are allowed", u.Redacted())
	}
	return u.Host, nil
}

func (o options) execute(ctx context.Context, out output) (err error) {
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if len(o.addrs) > 0 {
		err = o.drive(ctx, out)
	} else {
		err = o.compare(ctx, out)
	}
	if err == nil && o.memProfile != "" {
		err = writeHeapProfile(o.memProfile)
	}
	return err
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("memory profile: %w", err)
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("memory profile: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("memory profile: %w", err)
	}
	return nil
}

// config is the load of one run against addrs.
func (o options) config(addrs, metrics []string, w bench.Workload) bench.Config {
	w.Dist, w.Keys, w.HotFraction, w.ZipfS = o.dist, o.keys, o.hot, o.zipfS
	w.Over, w.OverFraction = o.over, o.overLimit
	return bench.Config{
		Addrs: addrs, Metrics: metrics, Concurrency: o.concurrency, Conns: o.conns, Rate: o.rate,
		Duration: o.duration, Requests: o.requests, Warmup: o.warmup, Timeout: o.timeout,
		Series: o.series, Prime: o.prime,
		Workload: w,
	}
}

func (o options) describe(w io.Writer) {
	loop := fmt.Sprintf("closed loop, concurrency %d", o.concurrency)
	if o.rate > 0 {
		loop = fmt.Sprintf("open loop at %g calls/s, at most %d in flight", o.rate, o.concurrency)
	}
	fmt.Fprintf(w, "load: %s, %d conns per target, %v per run after %v warmup, keys %d (%v",
		loop, o.conns, o.duration, o.warmup, o.keys, o.dist)
	switch o.dist {
	case bench.Hot:
		fmt.Fprintf(w, " %g", o.hot)
	case bench.Zipf:
		fmt.Fprintf(w, " s=%g", o.zipfS)
	}
	fmt.Fprint(w, ")")
	if o.overLimit > 0 {
		fmt.Fprintf(w, ", %g over limit (%s)", o.overLimit, strings.Join(entries(o.over), ","))
	}
	if o.timeout > 0 {
		fmt.Fprintf(w, ", %v per-call timeout", o.timeout)
	}
	if o.requests > 0 {
		fmt.Fprintf(w, ", at most %d calls per run", o.requests)
	}
	if o.prime {
		fmt.Fprint(w, ", primed (one call per target first)")
	}
	if o.series > 0 {
		fmt.Fprintf(w, ", series in %v windows", o.series)
	}
	fmt.Fprintf(w, "\nhost: %s/%s, GOMAXPROCS %d, NumCPU %d, %s\n",
		runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), runtime.NumCPU(), runtime.Version())
}

// drive runs the load once against running replicas.
func (o options) drive(ctx context.Context, out output) error {
	w := out.text
	o.describe(w)
	fmt.Fprintf(w, "target: %s, domain %q, descriptor %s\n", strings.Join(o.addrs, ", "), o.domain, strings.Join(entries(o.entries), ","))
	if len(o.metrics) > 0 {
		fmt.Fprintf(w, "metrics from: %s\n", strings.Join(o.metrics, ", "))
	}
	fmt.Fprintln(w)
	start := time.Now()
	r, err := bench.Run(ctx, o.config(o.addrs, o.metrics, bench.Workload{Domain: o.domain, Entries: o.entries}))
	if err != nil && r.Requests == 0 {
		return err
	}
	// When only the last scrape failed, the load was still measured:
	// show it, but write no record, which would lack the metrics asked
	// for.
	header(w)
	row(w, "-", "sluice", r)
	errorSummary(w, "", r)
	if o.rate > 0 {
		fmt.Fprintf(w, "open loop: %d calls due, %d sent late (over %v behind), %d dropped (every caller busy); latency counts from when each was due\n",
			r.Scheduled, r.Late, bench.LateAfter, r.Dropped)
	}
	if o.timeout > 0 {
		fmt.Fprintf(w, "past the deadline: %d of %d calls (DeadlineExceeded after %v)\n", r.PastDeadline, r.Requests, o.timeout)
	}
	if p := r.Prime; p != nil {
		fmt.Fprintf(w, "prime: %d calls (one per target, no deadline): %d OK, %d over limit, answered in %.1fms; sent %.1fms before the run's first call\n",
			p.Calls, p.OK, p.OverLimit, float64(p.Took)/float64(time.Millisecond), float64(p.Lead)/float64(time.Millisecond))
	}
	if len(r.Series) > 0 {
		fmt.Fprintln(w)
		seriesTable(w, r.Series)
	}
	if err != nil {
		return err
	}
	if r.Usage != nil {
		fmt.Fprintln(w)
		usage(w, r, *r.Usage)
	}
	return o.record(out, start, 0, "sluice", r)
}

// target is one server of the comparison.
type target struct {
	name string
	addr string
	// metrics is the server's /metrics URL, read around each run, or
	// none.
	metrics []string
	results []bench.Result
}

// redisSide is compare mode's Sluice on the Redis backend, served on
// loopback with its /metrics.
type redisSide struct {
	svc     *bench.RedisService
	addr    string
	metrics string
	// where describes the Redis it runs on.
	where   string
	cleanup []func()
}

// close stops what start started, last first.
func (r *redisSide) close() {
	for i := len(r.cleanup) - 1; i >= 0; i-- {
		r.cleanup[i]()
	}
}

// startRedis starts compare mode's Redis side: a redis-server (-redis)
// or the one at -redis-url, behind a delaying proxy with -redis-delay, a
// Sluice service on it with the rules and options of the memory side,
// its gRPC server and its /metrics, so that each run's Redis round trips
// are counted exactly as a replica's are (bench.Config.Metrics).
func (o options) startRedis(ctx context.Context) (r *redisSide, err error) {
	r = &redisSide{}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	redisURL := o.redisURL
	r.where = "Redis at " + redisURL
	if o.redis {
		dir, err := os.MkdirTemp("", "sluice-bench-redis-")
		if err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		r.cleanup = append(r.cleanup, func() { os.RemoveAll(dir) })
		// In memory (no RDB, no AOF) as redistest runs it, and refusing
		// writes rather than evicting buckets when full, as Sluice wants
		// (docs/redis.md).
		srv, err := redistest.Start(ctx, dir, redistest.Options{Config: []string{"maxmemory-policy", "noeviction"}})
		if err != nil {
			return nil, fmt.Errorf("start redis-server: %w", err)
		}
		r.cleanup = append(r.cleanup, srv.Stop)
		redisURL = "redis://" + srv.Addr()
		r.where = "redis-server at " + srv.Addr()
	}
	if o.redisDelay > 0 {
		hostPort, err := redisHostPort(redisURL)
		if err != nil {
			return nil, err
		}
		p, err := faultproxy.New(hostPort)
		if err != nil {
			return nil, err
		}
		r.cleanup = append(r.cleanup, func() { _ = p.Close() })
		p.SetDelay(o.redisDelay)
		u, _ := url.Parse(redisURL)
		u.Host = p.Addr()
		redisURL = u.String()
		r.where += fmt.Sprintf(", %v added to every round trip (proxy at %s)", o.redisDelay, p.Addr())
	}
	dialCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	client, err := redis.Dial(dialCtx, redis.Conn{URL: redisURL})
	if err != nil {
		return nil, err
	}
	r.cleanup = append(r.cleanup, client.Close)
	// The TTL rules of the memory side, and serve's defaults otherwise.
	opts := redis.Options{KeyPrefix: redisPrefix, TTLMultiplier: backend.DefaultTTLMultiplier}
	if !o.redisCoalesce {
		opts.MaxBatch = 1 // as serve --coalesce-writes=false
		r.where += ", coalescing off"
	}
	r.svc, err = bench.NewRedisService(bench.RulesYAML, client, opts)
	if err != nil {
		return nil, err
	}
	r.cleanup = append(r.cleanup, r.svc.Close)
	addr, stop, err := bench.Serve(r.svc.Service, r.svc.ServerOptions...)
	if err != nil {
		return nil, err
	}
	r.addr = addr
	r.cleanup = append(r.cleanup, func() { _ = stop() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", r.svc.Metrics)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	r.cleanup = append(r.cleanup, func() { _ = hs.Close() })
	r.metrics = "http://" + ln.Addr().String() + "/metrics"
	return r, nil
}

// decisions is how many decisions the service's metrics have counted
// since it started: the denominator of its Stats.
func (r *redisSide) decisions() (float64, error) {
	rec := httptest.NewRecorder()
	r.svc.Metrics.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	s, err := bench.ParseMetrics(rec.Body)
	if err != nil {
		return 0, err
	}
	return s.Calls[bench.Call{Backend: bench.BackendRedis, Operation: bench.OpDecide}], nil
}

// compare runs the rounds against both in-process servers.
func (o options) compare(ctx context.Context, out output) error {
	noopAddr, stopNoop, err := bench.Serve(bench.NoopServer{})
	if err != nil {
		return err
	}
	defer stopNoop()
	// The TTL rules and telemetry `sluice serve` has by default, so that
	// the memory side does the work it does in production.
	mem, err := bench.NewMemoryService(bench.RulesYAML, memory.Options{TTLMultiplier: backend.DefaultTTLMultiplier})
	if err != nil {
		return err
	}
	defer mem.Close()
	memAddr, stopMem, err := bench.Serve(mem.Service, mem.ServerOptions...)
	if err != nil {
		return err
	}
	defer stopMem()

	noopT := &target{name: "noop", addr: noopAddr}
	memT := &target{name: "memory", addr: memAddr}
	targets := []*target{noopT, memT}
	var redisT *target
	var rs *redisSide
	if o.withRedis() {
		if rs, err = o.startRedis(ctx); err != nil {
			return err
		}
		defer rs.close()
		redisT = &target{name: "redis", addr: rs.addr, metrics: []string{rs.metrics}}
		targets = append(targets, redisT)
	}
	w := out.text
	o.describe(w)
	fmt.Fprintf(w, "compare: %d rounds; noop at %s, memory (Sluice) at %s", o.rounds, noopAddr, memAddr)
	if redisT != nil {
		fmt.Fprintf(w, ", redis (Sluice) at %s on %s", rs.addr, rs.where)
	}
	fmt.Fprint(w, "\n\n")
	header(w)
	ratios := make([]float64, 0, o.rounds)
	var redisMem, redisNoop, trips []float64
	for round := 1; round <= o.rounds; round++ {
		// Forward in odd rounds, reversed in even ones: over two rounds
		// each server's mean position is the same, so a steady drift in
		// the machine's speed favours none.
		order := slices.Clone(targets)
		if round%2 == 0 {
			slices.Reverse(order)
		}
		for _, t := range order {
			start := time.Now()
			r, err := bench.Run(ctx, o.config([]string{t.addr}, t.metrics, bench.SingleKey()))
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round, t.name, err)
			}
			if ctx.Err() != nil {
				return fmt.Errorf("round %d, %s: %w", round, t.name, context.Cause(ctx))
			}
			t.results = append(t.results, r)
			row(w, fmt.Sprint(round), t.name, r)
			errorSummary(w, "  ", r)
			if u := r.Usage; u != nil && u.BackendCallsPerDecision != nil {
				fmt.Fprintf(w, "  redis round trips per decision: %.4f (%s over %.0f decisions)\n",
					*u.BackendCallsPerDecision, formatCounts(u.BackendCallsByOp), u.Decisions)
				trips = append(trips, *u.BackendCallsPerDecision)
			}
			if err := o.record(out, start, round, t.name, r); err != nil {
				return err
			}
		}
		ratios = append(ratios, memT.results[round-1].Throughput/noopT.results[round-1].Throughput)
		if redisT != nil {
			redisMem = append(redisMem, redisT.results[round-1].Throughput/memT.results[round-1].Throughput)
			redisNoop = append(redisNoop, redisT.results[round-1].Throughput/noopT.results[round-1].Throughput)
		}
	}

	fmt.Fprintf(w, "\nmedians over %d rounds:\n", o.rounds)
	fmt.Fprintf(w, "%-8s %12s %10s %10s %10s\n", "server", "req/s", "p50", "p99", "p999")
	for _, t := range targets {
		fmt.Fprintf(w, "%-8s %12.0f %10s %10s %10s\n", t.name,
			median(t.results, func(r bench.Result) float64 { return r.Throughput }),
			micros(median(t.results, func(r bench.Result) float64 { return float64(r.P50) })),
			micros(median(t.results, func(r bench.Result) float64 { return float64(r.P99) })),
			micros(median(t.results, func(r bench.Result) float64 { return float64(r.P999) })))
	}
	thr := func(r bench.Result) float64 { return r.Throughput }
	ratio := median(memT.results, thr) / median(noopT.results, thr)
	fmt.Fprintf(w, "\nper-round throughput ratio memory/noop: %s (median %.3f)\n",
		formatRatios(ratios), median(ratios, func(f float64) float64 { return f }))
	fmt.Fprintf(w, "ratio of median throughputs memory/noop: %.3f (requirement: at least 0.80)\n", ratio)
	if redisT == nil {
		return nil
	}
	id := func(f float64) float64 { return f }
	fmt.Fprintf(w, "\nper-round throughput ratio redis/memory: %s (median %.3f)\n", formatRatios(redisMem), median(redisMem, id))
	fmt.Fprintf(w, "per-round throughput ratio redis/noop: %s (median %.3f)\n", formatRatios(redisNoop), median(redisNoop, id))
	fmt.Fprintf(w, "ratio of median throughputs redis/memory: %.3f (target: at least 0.50)\n",
		median(redisT.results, thr)/median(memT.results, thr))
	fmt.Fprintf(w, "ratio of median throughputs redis/noop: %.3f\n", median(redisT.results, thr)/median(noopT.results, thr))
	fmt.Fprintf(w, "redis round trips per decision (EVALSHA + HGETALL over decisions, measured runs): median %.4f\n", median(trips, id))
	// The backend's own count, over everything the Redis side answered
	// (warmups and each connection's first call included): Scripts are
	// the EVALSHA round trips, and each config-cache miss waited for a
	// read (several may share one HGETALL).
	st := rs.svc.Backend.Stats()
	scripts, misses, failed := st.Scripts.Load(), st.CacheMisses.Load(), st.ScriptErrors.Load()
	decided, err := rs.decisions()
	if err != nil {
		return fmt.Errorf("redis side's metrics: %w", err)
	}
	if decided > 0 {
		fmt.Fprintf(w, "redis backend Stats, warmups included: %d script runs (%d failed), %d config cache misses, %.0f decisions: (Scripts + CacheMisses)/decision %.4f\n",
			scripts, failed, misses, decided, float64(scripts+misses)/decided)
	}
	return nil
}

func header(w io.Writer) {
	fmt.Fprintf(w, "%-5s %-8s %9s %6s %9s %10s %12s %10s %10s %10s %10s\n",
		"round", "server", "requests", "errors", "ok", "over_limit", "req/s", "p50", "p99", "p999", "max")
}

func row(w io.Writer, round, name string, r bench.Result) {
	fmt.Fprintf(w, "%-5s %-8s %9d %6d %9d %10d %12.0f %10s %10s %10s %10s\n",
		round, name, r.Requests, r.Errors, r.OK, r.OverLimit, r.Throughput,
		micros(float64(r.P50)), micros(float64(r.P99)), micros(float64(r.P999)), micros(float64(r.Max)))
}

// errorSummary prints the errors of r by gRPC code, and one of them.
func errorSummary(w io.Writer, indent string, r bench.Result) {
	if r.Errors == 0 {
		return
	}
	fmt.Fprintf(w, "%s%d errors (%s), first: %v\n", indent, r.Errors, formatCounts(errorCodes(r)), r.FirstError)
}

// errorCodes are r's errors by the name of their gRPC code.
func errorCodes(r bench.Result) map[string]uint64 {
	m := make(map[string]uint64, len(r.ErrorCodes))
	for c, n := range r.ErrorCodes {
		m[c.String()] = n
	}
	return m
}

// formatCounts formats counts by name as "a 1, b 2", in name order.
func formatCounts[N uint64 | float64](m map[string]N) string {
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+" "+strconv.FormatFloat(float64(m[k]), 'f', -1, 64))
	}
	return strings.Join(parts, ", ")
}

// usage prints the metrics block: what the backend did over the run.
// total is the sum of counts.
func total(counts map[string]float64) float64 {
	var n float64
	for _, c := range counts {
		n += c
	}
	return n
}

func usage(w io.Writer, r bench.Result, u bench.Usage) {
	fmt.Fprintf(w, "metrics: change over the measured run, summed over %d /metrics page(s)\n", u.Pages)
	line := func(name, value, note string) {
		if note != "" {
			note = "  (" + note + ")"
		}
		fmt.Fprintf(w, "  %-32s %12s%s\n", name, value, note)
	}
	line("backend decisions", count(&u.Decisions), "")
	for _, name := range slices.Sorted(maps.Keys(u.SlowAnswers)) {
		n := u.SlowAnswers[name]
		line("handled in over "+name, count(&n), "calls the replicas took longer than that over, arrival to answer")
	}
	if u.Backend == bench.BackendRedis {
		// None of the DynamoDB lines below means anything on Redis.
		line("redis round trips", count(&u.BackendCalls), formatCounts(u.BackendCallsByOp))
		if len(u.BackendErrors) > 0 {
			failed := total(u.BackendErrors)
			line("redis failed round trips", count(&failed), formatCounts(u.BackendErrors))
		}
		line("config cache misses", count(u.ConfigCacheMisses), "lookups that read Redis; one HGETALL batch may carry several")
		line("redis round trips per decision", per(u.BackendCallsPerDecision), "EVALSHA + HGETALL over backend decisions")
		return
	}
	line("dynamodb calls", count(&u.DynamoDBCalls), formatCounts(u.DynamoDBCallsByOp))
	line("dynamodb writes", count(&u.Writes), "UpdateItem + PutItem + TransactWriteItems")
	if len(u.DynamoDBErrors) > 0 {
		failed := total(u.DynamoDBErrors)
		line("dynamodb failed calls", count(&failed), formatCounts(u.DynamoDBErrors))
	}
	line("read capacity units", units(u.ReadUnits), "")
	line("write capacity units", units(u.WriteUnits), "")
	line("condition retries", count(u.ConditionRetries), "")
	line("local answers", count(u.LocalAnswers), "")
	line("coalesced decisions", count(u.CoalescedDecisions), "")
	line("lease writes", count(u.LeaseWrites), "granted or gave back lease tokens, part of the writes")
	line("contended denials", count(u.ContendedDenials), "lost every write race near the limit")
	line("dynamodb calls per decision", per(u.CallsPerDecision), "")
	line("RCU per decision", per(u.RCUPerDecision), "")
	line("WCU per decision", per(u.WCUPerDecision), "")
	line("writes per allowed decision", per(u.WritesPerAllowed), fmt.Sprintf("over %d OK answers", r.OK))
	line("denials answered without a call", share(u.LocalDenialShare), fmt.Sprintf("local answers over %d over_limit answers", r.OverLimit))
	line("coalesced share", share(u.CoalescedShare), "coalesced over backend decisions")
}

// The formats of the metrics block; "n/a" for a number that does not
// exist (its counter was not served, or its denominator is zero).
func count(v *float64) string { return orNA(v, "%.0f", 1) }
func units(v *float64) string { return orNA(v, "%.1f", 1) }
func per(v *float64) string   { return orNA(v, "%.4f", 1) }
func share(v *float64) string { return orNA(v, "%.2f%%", 100) }

func orNA(v *float64, format string, scale float64) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf(format, *v*scale)
}

// record is the JSON of one run.
type record struct {
	Time         time.Time         `json:"time"`
	Config       recordConfig      `json:"config"`
	Round        int               `json:"round,omitempty"`
	Server       string            `json:"server"`
	Requests     uint64            `json:"requests"`
	Errors       uint64            `json:"errors"`
	ErrorsByCode map[string]uint64 `json:"errors_by_code"`
	FirstError   string            `json:"first_error,omitempty"`
	OK           uint64            `json:"ok"`
	OverLimit    uint64            `json:"over_limit"`
	// Open loop only (config.rate > 0): calls due, sent late, dropped.
	Scheduled uint64  `json:"scheduled,omitempty"`
	Late      uint64  `json:"late,omitempty"`
	Dropped   uint64  `json:"dropped,omitempty"`
	Elapsed   float64 `json:"elapsed_seconds"`
	// Throughput counts answered calls, each one decision of one
	// descriptor.
	Throughput float64      `json:"decisions_per_second"`
	P50        float64      `json:"p50_us"`
	P99        float64      `json:"p99_us"`
	P999       float64      `json:"p999_us"`
	Max        float64      `json:"max_us"`
	Metrics    *bench.Usage `json:"metrics"`
	// With -addr: the calls that failed past their deadline; with
	// -series the windows; with -prime the priming calls.
	PastDeadline *uint64        `json:"past_deadline,omitempty"`
	Series       []seriesRecord `json:"series,omitempty"`
	Prime        *primeRecord   `json:"prime,omitempty"`
}

// seriesRecord is one window of -series, flat: seconds from the run's
// first call, the calls answered in it, and with -metrics what the
// backend did between the scrapes at metrics_from and metrics_to (null
// when the scrape closing it failed).
type seriesRecord struct {
	Start        float64 `json:"start"`
	End          float64 `json:"end"`
	Requests     uint64  `json:"calls"`
	OK           uint64  `json:"ok"`
	OverLimit    uint64  `json:"over_limit"`
	Errors       uint64  `json:"errors"`
	PastDeadline uint64  `json:"past_deadline"`
	Late         uint64  `json:"late"`
	Throughput   float64 `json:"decisions_per_second"`
	P50          float64 `json:"p50_us"`
	P99          float64 `json:"p99_us"`
	// The metrics: decisions, the store's calls (DynamoDB API calls or
	// Redis round trips), DynamoDB's writes, and DynamoDB's local
	// answers and lease writes (null where not served).
	Decisions    *float64 `json:"backend_decisions,omitempty"`
	BackendCalls *float64 `json:"backend_calls,omitempty"`
	Writes       *float64 `json:"writes,omitempty"`
	LocalAnswers *float64 `json:"local_answers,omitempty"`
	LeaseWrites  *float64 `json:"lease_writes,omitempty"`
	MetricsFrom  *float64 `json:"metrics_from,omitempty"`
	MetricsTo    *float64 `json:"metrics_to,omitempty"`
	ScrapeError  string   `json:"scrape_error,omitempty"`
}

// primeRecord is -prime's calls: their answers, how long they took, and
// how long before the run's first call they were sent (lead_seconds).
type primeRecord struct {
	Calls     uint64  `json:"calls"`
	OK        uint64  `json:"ok"`
	OverLimit uint64  `json:"over_limit"`
	Took      float64 `json:"took_seconds"`
	Lead      float64 `json:"lead_seconds"`
}

func seriesRecords(ws []bench.Window) []seriesRecord {
	out := make([]seriesRecord, len(ws))
	for i, w := range ws {
		s := seriesRecord{
			Start: w.Start.Seconds(), End: w.End.Seconds(),
			Requests: w.Requests, OK: w.OK, OverLimit: w.OverLimit, Errors: w.Errors,
			PastDeadline: w.PastDeadline, Late: w.Late, Throughput: w.Throughput,
			P50: us(w.P50), P99: us(w.P99),
		}
		if u := w.Usage; u != nil {
			decisions, calls := u.Decisions, u.BackendCalls
			s.Decisions, s.BackendCalls = &decisions, &calls
			if u.Backend != bench.BackendRedis {
				writes := u.Writes
				s.Writes = &writes
			}
			s.LocalAnswers, s.LeaseWrites = u.LocalAnswers, u.LeaseWrites
			mf, mt := w.MetricsFrom.Seconds(), w.MetricsTo.Seconds()
			s.MetricsFrom, s.MetricsTo = &mf, &mt
		}
		if w.ScrapeError != nil {
			s.ScrapeError = w.ScrapeError.Error()
		}
		out[i] = s
	}
	return out
}

// seriesTable prints the windows of -series, one line each.
func seriesTable(w io.Writer, ws []bench.Window) {
	metrics := slices.ContainsFunc(ws, func(x bench.Window) bool { return x.Usage != nil || x.ScrapeError != nil })
	fmt.Fprintf(w, "series: windows from the run's first call; a call counts in the window its answer came back in\n")
	fmt.Fprintf(w, "%17s %8s %8s %8s %6s %8s %6s %10s %10s %10s", "window", "calls", "ok", "over", "errors", "past_dl", "late", "decided/s", "p50", "p99")
	if metrics {
		// be_calls: the store's calls (DynamoDB's API calls, Redis's
		// round trips); writes: DynamoDB's.
		fmt.Fprintf(w, " %9s %9s %9s", "decisions", "be_calls", "writes")
	}
	fmt.Fprintln(w)
	for _, x := range ws {
		fmt.Fprintf(w, "%7.2fs-%7.2fs %8d %8d %8d %6d %8d %6d %10.0f %10s %10s", x.Start.Seconds(), x.End.Seconds(),
			x.Requests, x.OK, x.OverLimit, x.Errors, x.PastDeadline, x.Late, x.Throughput, micros(float64(x.P50)), micros(float64(x.P99)))
		if u := x.Usage; u != nil {
			writes := count(&u.Writes)
			if u.Backend == bench.BackendRedis {
				writes = "n/a"
			}
			fmt.Fprintf(w, " %9s %9s %9s", count(&u.Decisions), count(&u.BackendCalls), writes)
		} else if x.ScrapeError != nil {
			fmt.Fprintf(w, "  scrape failed: %v", x.ScrapeError)
		}
		fmt.Fprintln(w)
	}
}

// recordConfig is the command line of a record, after defaults.
type recordConfig struct {
	Args           []string `json:"args"`
	Mode           string   `json:"mode"`
	Addrs          []string `json:"addrs,omitempty"`
	MetricsURLs    []string `json:"metrics_urls,omitempty"`
	Domain         string   `json:"domain,omitempty"`
	Descriptor     []string `json:"descriptor,omitempty"`
	OverDescriptor []string `json:"over_descriptor,omitempty"`
	OverLimit      float64  `json:"over_limit"`
	Rounds         int      `json:"rounds,omitempty"`
	Concurrency    int      `json:"concurrency"`
	Rate           float64  `json:"rate"`
	Conns          int      `json:"conns"`
	Duration       string   `json:"duration"`
	Warmup         string   `json:"warmup"`
	Timeout        string   `json:"timeout"`
	Requests       int64    `json:"requests"`
	Series         string   `json:"series,omitempty"`
	Prime          bool     `json:"prime,omitempty"`
	Fresh          bool     `json:"fresh,omitempty"`
	Keys           int      `json:"keys"`
	Dist           string   `json:"dist"`
	Hot            float64  `json:"hot"`
	ZipfS          float64  `json:"zipf_s"`
	GOOS           string   `json:"goos"`
	GOARCH         string   `json:"goarch"`
	GOMAXPROCS     int      `json:"gomaxprocs"`
	NumCPU         int      `json:"num_cpu"`
	GoVersion      string   `json:"go_version"`
	// Compare mode's Redis side: "redis-server" (-redis) or the URL,
	// and the delay added to its round trips.
	Redis         string `json:"redis,omitempty"`
	RedisDelay    string `json:"redis_delay,omitempty"`
	RedisCoalesce *bool  `json:"redis_coalesce,omitempty"`
}

// record writes the JSON record of one run, with -json.
func (o options) record(out output, start time.Time, round int, server string, r bench.Result) error {
	if out.json == nil {
		return nil
	}
	c := recordConfig{
		Args: o.args, Mode: "compare", Addrs: o.addrs, MetricsURLs: o.metrics, Domain: o.domain,
		Descriptor: entries(o.entries), OverDescriptor: entries(o.over), OverLimit: o.overLimit,
		Rounds: o.rounds, Concurrency: o.concurrency, Rate: o.rate, Conns: o.conns,
		Duration: o.duration.String(), Warmup: o.warmup.String(), Timeout: o.timeout.String(),
		Requests: o.requests, Keys: o.keys, Dist: o.dist.String(), Hot: o.hot, ZipfS: o.zipfS,
		Prime: o.prime, Fresh: o.fresh,
		GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, GOMAXPROCS: runtime.GOMAXPROCS(0),
		NumCPU: runtime.NumCPU(), GoVersion: runtime.Version(),
	}
	if len(o.addrs) > 0 {
		c.Mode, c.Rounds = "addr", 0
	}
	if o.series > 0 {
		c.Series = o.series.String()
	}
	if o.withRedis() {
		c.Redis, c.RedisDelay, c.RedisCoalesce = "redis-server", o.redisDelay.String(), &o.redisCoalesce
		if o.redisURL != "" {
			c.Redis = redactURL(o.redisURL)
		}
	}
	rec := record{
		Time: start.UTC(), Config: c, Round: round, Server: server,
		Requests: r.Requests, Errors: r.Errors, ErrorsByCode: errorCodes(r),
		OK: r.OK, OverLimit: r.OverLimit, Scheduled: r.Scheduled, Late: r.Late, Dropped: r.Dropped, Elapsed: r.Elapsed.Seconds(), Throughput: r.Throughput,
		P50: us(r.P50), P99: us(r.P99), P999: us(r.P999), Max: us(r.Max),
		Metrics: r.Usage,
	}
	if len(o.addrs) > 0 {
		rec.PastDeadline = &r.PastDeadline
	}
	if len(r.Series) > 0 {
		rec.Series = seriesRecords(r.Series)
	}
	if p := r.Prime; p != nil {
		rec.Prime = &primeRecord{Calls: p.Calls, OK: p.OK, OverLimit: p.OverLimit, Took: p.Took.Seconds(), Lead: p.Lead.Seconds()}
	}
	if r.FirstError != nil {
		rec.FirstError = r.FirstError.Error()
	}
	if err := out.json.Encode(rec); err != nil {
		return fmt.Errorf("json record: %w", err)
	}
	return nil
}

// redactURL hides a URL's password.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

func entries(es []bench.Entry) []string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = e.Key + "=" + e.Value
	}
	return s
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// µs formats nanoseconds as microseconds, the scale of loopback calls.
func micros(ns float64) string { return fmt.Sprintf("%.0fµs", ns/float64(time.Microsecond)) }

func formatRatios(rs []float64) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%.3f", r)
	}
	return strings.Join(parts, " ")
}

// median of f over xs; the mean of the middle two for an even count.
func median[T any](xs []T, f func(T) float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	vs := make([]float64, len(xs))
	for i, x := range xs {
		vs[i] = f(x)
	}
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2]
	}
	return (vs[n/2-1] + vs[n/2]) / 2
}
