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
	"math"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/bench"
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
