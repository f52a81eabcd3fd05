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
// favour one side.
//
// With -addr it drives an already running Sluice (such as `sluice serve`)
// instead, with the domain and descriptor given, and prints the result.
// Only loopback targets are accepted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// options are the command line.
type options struct {
	addr, domain           string
	entries                []bench.Entry
	rounds                 int
	concurrency, conns     int
	keys                   int
	dist                   bench.Distribution
	hot                    float64
	duration, warmup       time.Duration
	requests               int64
	cpuProfile, memProfile string
}

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
	if err := o.execute(ctx, stdout); err != nil {
		fmt.Fprintln(stderr, "sluice-bench:", err)
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{dist: bench.Fixed}
	fs := flag.NewFlagSet("sluice-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage:
  sluice-bench [flags]              compare a do-nothing server and Sluice (memory backend), in process
  sluice-bench -addr HOST:PORT -domain D -descriptor K=V [flags]
                                    drive a running Sluice on loopback

Each round is a closed loop: -concurrency workers over -conns gRPC
connections, each sending its next ShouldRateLimit call as soon as the last
is answered, for -duration after -warmup.

Flags:
`)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.addr, "addr", "", "drive the Sluice at this loopback `host:port` instead of comparing in process")
	fs.StringVar(&o.domain, "domain", "", "with -addr: the request domain")
	fs.Func("descriptor", "with -addr: a `key=value` entry of the one descriptor sent; repeat for more entries, in order", func(s string) error {
		e, err := bench.ParseEntry(s)
		if err == nil {
			o.entries = append(o.entries, e)
		}
		return err
	})
	fs.IntVar(&o.rounds, "rounds", 5, "compare mode: rounds, each running both servers")
	fs.IntVar(&o.concurrency, "concurrency", bench.DefaultConcurrency, "concurrent callers (goroutines)")
	fs.IntVar(&o.conns, "conns", bench.DefaultConns, "gRPC connections the callers share")
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "measured time per run (per server per round)")
	fs.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "unmeasured load before each run; 0 for none")
	fs.Int64Var(&o.requests, "requests", 0, "also end each run after this many calls; 0 for no count bound")
	fs.IntVar(&o.keys, "keys", 1, "distinct descriptor values (the last entry's value gets -0, -1, ... appended); with 1, one fixed value")
	fs.Func("dist", "how calls spread over -keys: `fixed|uniform|hot` (default fixed, uniform when -keys > 1)", func(s string) error {
		d, err := bench.ParseDistribution(s)
		o.dist = d
		return err
	})
	fs.Float64Var(&o.hot, "hot", bench.DefaultHotFraction, "with -dist hot: share of calls sent to the hot key")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to `file`")
	fs.StringVar(&o.memProfile, "memprofile", "", "write an allocation profile at the end to `file`")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["dist"] && o.keys > 1 {
		o.dist = bench.Uniform
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.addr != "" && (o.domain == "" || len(o.entries) == 0):
		return o, errors.New("-addr needs -domain and at least one -descriptor key=value")
	case o.addr == "" && (set["domain"] || set["descriptor"]):
		return o, errors.New("-domain and -descriptor go with -addr; compare mode sends its own benchmark rules' descriptor")
	case o.addr != "" && set["rounds"]:
		return o, errors.New("-rounds is for compare mode; with -addr there is one run")
	case o.rounds < 1:
		return o, fmt.Errorf("-rounds %d: want at least 1", o.rounds)
	case o.concurrency < 1 || o.conns < 1 || o.keys < 1:
		return o, errors.New("-concurrency, -conns and -keys must be at least 1")
	case o.duration <= 0:
		return o, fmt.Errorf("-duration %v: want a positive duration", o.duration)
	case o.hot < 0 || o.hot > 1:
		return o, fmt.Errorf("-hot %v: want a share from 0 to 1", o.hot)
	}
	return o, nil
}

func (o options) execute(ctx context.Context, w io.Writer) (err error) {
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
	if o.addr != "" {
		err = o.drive(ctx, w)
	} else {
		err = o.compare(ctx, w)
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

// config is the load of one run against addr.
func (o options) config(addr string, w bench.Workload) bench.Config {
	w.Dist, w.Keys, w.HotFraction = o.dist, o.keys, o.hot
	return bench.Config{
		Addr: addr, Concurrency: o.concurrency, Conns: o.conns,
		Duration: o.duration, Requests: o.requests, Warmup: o.warmup,
		Workload: w,
	}
}

func (o options) describe(w io.Writer) {
	fmt.Fprintf(w, "load: concurrency %d, %d conns, %v per run after %v warmup, keys %d (%v)",
		o.concurrency, o.conns, o.duration, o.warmup, o.keys, o.dist)
	if o.requests > 0 {
		fmt.Fprintf(w, ", at most %d calls per run", o.requests)
	}
	fmt.Fprintf(w, "\nhost: %s/%s, GOMAXPROCS %d, NumCPU %d, %s\n",
		runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), runtime.NumCPU(), runtime.Version())
}

// drive runs the load once against a running service.
func (o options) drive(ctx context.Context, w io.Writer) error {
	o.describe(w)
	fmt.Fprintf(w, "target: %s, domain %q, descriptor %v\n\n", o.addr, o.domain, o.entries)
	r, err := bench.Run(ctx, o.config(o.addr, bench.Workload{Domain: o.domain, Entries: o.entries}))
	if err != nil {
		return err
	}
	header(w)
	row(w, "-", "sluice", r)
	if r.Errors > 0 {
		fmt.Fprintf(w, "first error: %v\n", r.FirstError)
	}
	return nil
}

// target is one server of the comparison.
type target struct {
	name    string
	addr    string
	results []bench.Result
}

// compare runs the rounds against both in-process servers.
func (o options) compare(ctx context.Context, w io.Writer) error {
	noopAddr, stopNoop, err := bench.Serve(bench.NoopServer{})
	if err != nil {
		return err
	}
	defer stopNoop()
	// The TTL rules and telemetry `sluice serve` has by default, so that
	// the memory side does the work it does in production.
	svc, serverOpts, release, err := bench.NewMemoryService(bench.RulesYAML, memory.Options{TTLMultiplier: backend.DefaultTTLMultiplier})
	if err != nil {
		return err
	}
	defer release()
	memAddr, stopMem, err := bench.Serve(svc, serverOpts...)
	if err != nil {
		return err
	}
	defer stopMem()

	noop := &target{name: "noop", addr: noopAddr}
	mem := &target{name: "memory", addr: memAddr}
	o.describe(w)
	fmt.Fprintf(w, "compare: %d rounds; noop at %s, memory (Sluice) at %s\n\n", o.rounds, noopAddr, memAddr)
	header(w)
	ratios := make([]float64, 0, o.rounds)
	for round := 1; round <= o.rounds; round++ {
		order := []*target{noop, mem}
		if round%2 == 0 {
			order = []*target{mem, noop}
		}
		for _, t := range order {
			r, err := bench.Run(ctx, o.config(t.addr, bench.SingleKey()))
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round, t.name, err)
			}
			if ctx.Err() != nil {
				return fmt.Errorf("round %d, %s: %w", round, t.name, context.Cause(ctx))
			}
			t.results = append(t.results, r)
			row(w, fmt.Sprint(round), t.name, r)
			if r.Errors > 0 {
				fmt.Fprintf(w, "  %d errors, first: %v\n", r.Errors, r.FirstError)
			}
		}
		ratios = append(ratios, mem.results[round-1].Throughput/noop.results[round-1].Throughput)
	}

	fmt.Fprintf(w, "\nmedians over %d rounds:\n", o.rounds)
	fmt.Fprintf(w, "%-8s %12s %10s %10s %10s\n", "server", "req/s", "p50", "p99", "p999")
	for _, t := range []*target{noop, mem} {
		fmt.Fprintf(w, "%-8s %12.0f %10s %10s %10s\n", t.name,
			median(t.results, func(r bench.Result) float64 { return r.Throughput }),
			micros(median(t.results, func(r bench.Result) float64 { return float64(r.P50) })),
			micros(median(t.results, func(r bench.Result) float64 { return float64(r.P99) })),
			micros(median(t.results, func(r bench.Result) float64 { return float64(r.P999) })))
	}
	thr := func(r bench.Result) float64 { return r.Throughput }
	ratio := median(mem.results, thr) / median(noop.results, thr)
	fmt.Fprintf(w, "\nper-round throughput ratio memory/noop: %s (median %.3f)\n",
		formatRatios(ratios), median(ratios, func(f float64) float64 { return f }))
	fmt.Fprintf(w, "ratio of median throughputs memory/noop: %.3f (requirement: at least 0.80)\n", ratio)
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
