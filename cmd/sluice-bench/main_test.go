package main

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
	"github.com/sluice-rl/sluice/bench"
)

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{
		"-addr", "127.0.0.1:1, 127.0.0.1:2", "-metrics", "http://127.0.0.1:3/metrics,http://127.0.0.1:4/metrics",
		"-domain", "bench", "-descriptor", "bench_key=k", "-keys", "1000", "-dist", "zipf", "-zipf-s", "1.3",
		"-over-limit", "0.25", "-over-descriptor", "bench_over=x", "-timeout", "20ms", "-json",
	}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.addrs) != 2 || o.addrs[1] != "127.0.0.1:2" || len(o.metrics) != 2 || o.dist != bench.Zipf || o.zipfS != 1.3 ||
		o.overLimit != 0.25 || len(o.over) != 1 || o.timeout != 20*time.Millisecond || !o.json {
		t.Fatalf("parsed %+v", o)
	}
	// Compare mode brings its own over-limit descriptor.
	if o, err := parseFlags([]string{"-over-limit", "1"}, &bytes.Buffer{}); err != nil || len(o.over) != 1 || o.over[0].Key != bench.OverKey {
		t.Fatalf("compare mode -over-limit 1: %+v, %v", o.over, err)
	}

	// The Redis side of compare mode.
	if o, err := parseFlags([]string{"-redis-url", "redis://127.0.0.1:6379/0", "-redis-delay", "500us"}, &bytes.Buffer{}); err != nil ||
		!o.withRedis() || o.redis || o.redisDelay != 500*time.Microsecond {
		t.Fatalf("-redis-url with -redis-delay: %+v, %v", o, err)
	}
	if o, err := parseFlags([]string{"-redis"}, &bytes.Buffer{}); err != nil || !o.withRedis() || o.redisDelay != 0 || !o.redisCoalesce {
		t.Fatalf("-redis: %+v, %v", o, err)
	}
	if o, err := parseFlags(nil, &bytes.Buffer{}); err != nil || o.withRedis() {
		t.Fatalf("no Redis flag: %+v, %v", o, err)
	}

	drive := []string{"-addr", "127.0.0.1:1", "-domain", "bench", "-descriptor", "bench_key=k"}
	for name, args := range map[string][]string{
		"metrics without addr":         {"-metrics", "http://127.0.0.1:3/metrics"},
		"over descriptor without addr": {"-over-descriptor", "bench_over=x"},
		"over limit without over desc": slices.Concat(drive, []string{"-over-limit", "0.5"}),
		"over limit above 1":           slices.Concat(drive, []string{"-over-limit", "1.5", "-over-descriptor", "o=x"}),
		"zipf s 1":                     {"-dist", "zipf", "-zipf-s", "1"},
		"unknown dist":                 {"-dist", "pareto"},
		"negative timeout":             {"-timeout", "-1s"},
		"empty addr item":              slices.Concat(drive, []string{"-addr", "127.0.0.1:1,"}),
		"rounds with addr":             slices.Concat(drive, []string{"-rounds", "3"}),
		"negative rate":                slices.Concat(drive, []string{"-rate", "-5"}),
		"infinite rate":                slices.Concat(drive, []string{"-rate", "+Inf"}),
		"rate in compare mode":         {"-rate", "100"},
		"redis with addr":              slices.Concat(drive, []string{"-redis"}),
		"redis url with addr":          slices.Concat(drive, []string{"-redis-url", "redis://127.0.0.1:6379"}),
		"redis and redis url":          {"-redis", "-redis-url", "redis://127.0.0.1:6379"},
		"redis delay alone":            {"-redis-delay", "1ms"},
		"redis coalesce alone":         {"-redis-coalesce=false"},
		"negative redis delay":         {"-redis", "-redis-delay", "-1ms"},
		"remote redis":                 {"-redis-url", "redis://192.0.2.1:6379"},
		"redis without port":           {"-redis-url", "redis://127.0.0.1"},
		"redis socket":                 {"-redis-url", "unix:///tmp/redis.sock"},
		"redis over TLS":               {"-redis-url", "rediss://127.0.0.1:6379"},
		"redis URL not a URL":          {"-redis-url", "127.0.0.1:6379"},
		"series in compare mode":       {"-series", "1s"},
		"series zero":                  slices.Concat(drive, []string{"-series", "0"}),
		"negative series":              slices.Concat(drive, []string{"-series", "-1s"}),
		"series of too many windows":   slices.Concat(drive, []string{"-series", "1ms", "-duration", "10s"}),
		"prime in compare mode":        {"-prime"},
		"fresh in compare mode":        {"-fresh"},
	} {
		if _, err := parseFlags(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%s: %q accepted", name, args)
		}
	}
}

// TestDriveJSON runs the command against an in-process Sluice with its
// /metrics and checks the JSON record and the metrics block.
func TestDriveJSON(t *testing.T) {
	addr, metrics := memoryTarget(t)
	rec, report := driveRecord(t,
		"-addr", addr, "-metrics", metrics, "-domain", bench.Domain, "-descriptor", bench.Key+"=k",
		"-over-limit", "0.5", "-over-descriptor", bench.OverKey+"=x", "-keys", "10", "-dist", "zipf",
		"-concurrency", "4", "-conns", "1", "-requests", "300", "-duration", "1m", "-warmup", "0")
	switch {
	case rec.Requests != 300 || rec.Errors != 0 || rec.OK+rec.OverLimit != 300 || rec.OverLimit == 0:
		t.Fatalf("record %+v: want 300 calls, some over limit, no errors", rec)
	case rec.Config.Mode != "addr" || rec.Config.Dist != "zipf" || rec.Config.OverLimit != 0.5 || len(rec.Config.Addrs) != 1:
		t.Fatalf("config %+v", rec.Config)
	case rec.Metrics == nil || rec.Metrics.Decisions != 300 || rec.Metrics.ReadUnits != nil:
		t.Fatalf("metrics %+v: want 300 backend decisions, no DynamoDB counters", rec.Metrics)
	case rec.Throughput <= 0 || rec.P50 <= 0:
		t.Fatalf("throughput %v, p50 %vµs", rec.Throughput, rec.P50)
	}
	for _, want := range []string{"backend decisions", "300", "n/a", "writes per allowed decision"} {
		if !strings.Contains(report, want) {
			t.Errorf("report on stderr lacks %q:\n%s", want, report)
		}
	}
}

// With -series, -prime and -fresh against a served Sluice: the record
// has one window per -series of -duration, adding up to the run, each
// with the backend decisions its metrics moved by; one priming call per
// target; a descriptor value of this run's own; and the report shows the
// windows and the priming calls.
func TestDriveSeriesJSON(t *testing.T) {
	addr, metrics := memoryTarget(t)
	rec, report := driveRecord(t,
		"-addr", addr, "-metrics", metrics, "-domain", bench.Domain, "-descriptor", bench.Key+"=s", "-fresh", "-prime",
		"-series", "150ms", "-duration", "600ms", "-warmup", "0", "-concurrency", "4", "-conns", "1", "-timeout", "10s")
	if len(rec.Series) != 4 {
		t.Fatalf("%d windows, want 4 of 150ms over 600ms: %+v", len(rec.Series), rec.Series)
	}
	var calls, ok uint64
	var decisions float64
	for i, w := range rec.Series {
		calls, ok = calls+w.Requests, ok+w.OK
		if w.Decisions != nil {
			decisions += *w.Decisions
		}
		if math.Abs(w.Start-float64(i)*0.15) > 1e-9 || w.Writes == nil || *w.Writes != 0 {
			t.Errorf("window %d: %+v: want it from %vs, with 0 DynamoDB writes (memory backend)", i, w, float64(i)*0.15)
		}
	}
	if calls != rec.Requests || ok != rec.OK || rec.Metrics == nil || decisions != rec.Metrics.Decisions || rec.Series[3].End != rec.Elapsed {
		t.Errorf("windows add up to %d calls, %d OK, %v decisions, to %vs; the run: %d, %d, %+v, %vs", calls, ok, decisions,
			rec.Series[3].End, rec.Requests, rec.OK, rec.Metrics, rec.Elapsed)
	}
	if p := rec.Prime; p == nil || p.Calls != 1 || p.OK != 1 || p.Lead < p.Took {
		t.Errorf("prime %+v: want one call, OK", p)
	}
	if rec.PastDeadline == nil || *rec.PastDeadline != 0 || !rec.Config.Prime || !rec.Config.Fresh || rec.Config.Series != "150ms" {
		t.Errorf("past deadline %v, config %+v", rec.PastDeadline, rec.Config)
	}
	if d := rec.Config.Descriptor; len(d) != 1 || !strings.HasPrefix(d[0], bench.Key+"=s-") || len(d[0]) < len(bench.Key)+5 {
		t.Errorf("descriptor %q: want %s=s- and this run's own suffix", d, bench.Key)
	}
	for _, want := range []string{"series: windows from the run's first call", "0.00s-   0.15s", "prime: 1 calls", "past the deadline: 0 of"} {
		if !strings.Contains(report, want) {
			t.Errorf("report on stderr lacks %q:\n%s", want, report)
		}
	}
}

// driveRecord runs sluice-bench with args and -json, and returns the one
// record it printed and its report.
func driveRecord(t *testing.T, args ...string) (record, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), append(args, "-json"), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var rec record
	dec := json.NewDecoder(&stdout)
	if err := dec.Decode(&rec); err != nil {
		t.Fatalf("stdout is not a JSON record: %v\n%s", err, stdout.String())
	}
	if dec.More() {
		t.Fatal("more than one record for one run")
	}
	return rec, stderr.String()
}

// memoryTarget serves Sluice on the memory backend with the benchmark
// rules, and its /metrics, for the length of t.
func memoryTarget(t *testing.T) (addr, metrics string) {
	t.Helper()
	m, err := bench.NewMemoryService(bench.RulesYAML, memory.Options{TTLMultiplier: backend.DefaultTTLMultiplier})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	addr, stop, err := bench.Serve(m.Service, m.ServerOptions...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stop() })
	page := httptest.NewServer(m.Metrics)
	t.Cleanup(page.Close)
	return addr, page.URL + "/metrics"
}

// With -rate the run is an open loop, and its record says how many calls
// came due, how many were late and how many were dropped.
func TestDriveOpenLoopJSON(t *testing.T) {
	addr, metrics := memoryTarget(t)
	rec, report := driveRecord(t,
		"-addr", addr, "-metrics", metrics, "-domain", bench.Domain, "-descriptor", bench.Key+"=k",
		"-rate", "500", "-duration", "400ms", "-warmup", "0", "-concurrency", "8", "-conns", "1")
	if rec.Config.Rate != 500 || rec.Scheduled != 200 || rec.Requests+rec.Dropped != 200 || rec.Metrics == nil ||
		rec.Metrics.Decisions != float64(rec.OK+rec.OverLimit) {
		t.Fatalf("record %+v: want 200 calls due at 500/s over 400ms, each sent or dropped, each sent one decision", rec)
	}
	if !strings.Contains(report, "open loop at 500 calls/s") || !strings.Contains(report, "200 calls due") {
		t.Errorf("report on stderr does not describe the open loop:\n%s", report)
	}
}

// TestCompareJSON checks that compare mode writes one record per server
// per round.
func TestCompareJSON(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"-rounds", "1", "-duration", "50ms", "-warmup", "0", "-concurrency", "4", "-conns", "1", "-json"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	dec := json.NewDecoder(&stdout)
	servers := map[string]bool{}
	for dec.More() {
		var rec record
		if err := dec.Decode(&rec); err != nil {
			t.Fatal(err)
		}
		if rec.Round != 1 || rec.Config.Mode != "compare" || rec.Requests == 0 || rec.Metrics != nil {
			t.Errorf("record %+v", rec)
		}
		servers[rec.Server] = true
	}
	if len(servers) != 2 || !servers["noop"] || !servers["memory"] {
		t.Fatalf("records for %v: want noop and memory", servers)
	}
	if !strings.Contains(stderr.String(), "ratio of median throughputs") {
		t.Errorf("report missing from stderr:\n%s", stderr.String())
	}
}

// compareRecords runs compare mode with args and returns its JSON records
// by server, in the order they came, and the report.
func compareRecords(t *testing.T, args ...string) (map[string][]record, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), append(args, "-json"), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	recs := map[string][]record{}
	dec := json.NewDecoder(&stdout)
	for dec.More() {
		var rec record
		if err := dec.Decode(&rec); err != nil {
			t.Fatal(err)
		}
		recs[rec.Server] = append(recs[rec.Server], rec)
	}
	return recs, stderr.String()
}

// With -redis-url, Redis joins the rounds as a third server: one record
// per round, its round trips counted from its own /metrics over the
// measured run (one script per decision, at most, and the config reads),
// the ratios and the backend's Stats in the report, and with
// -redis-delay every round trip late by the delay.
func TestCompareRedis(t *testing.T) {
	srv := redistest.Require(t)
	recs, report := compareRecords(t, "-redis-url", srv.URL(), "-redis-delay", "2ms",
		"-rounds", "2", "-duration", "100ms", "-warmup", "20ms", "-concurrency", "4", "-conns", "1")
	if len(recs) != 3 || len(recs["noop"]) != 2 || len(recs["memory"]) != 2 || len(recs["redis"]) != 2 {
		t.Fatalf("records for %v: want two rounds of noop, memory and redis", recs)
	}
	for _, rec := range recs["redis"] {
		u := rec.Metrics
		switch {
		case rec.Requests == 0 || rec.Errors != 0 || rec.OK != rec.Requests:
			t.Errorf("redis round %d: %+v: want calls, all OK", rec.Round, rec)
		case rec.Config.Redis != srv.URL() || rec.Config.RedisDelay != "2ms":
			t.Errorf("redis round %d: config %+v", rec.Round, rec.Config)
		case u == nil || u.Backend != bench.BackendRedis || u.Decisions != float64(rec.OK):
			t.Errorf("redis round %d: metrics %+v: want one redis decision per answered call", rec.Round, u)
		case u.BackendCallsByOp[bench.OpEvalSHA] < 1 || u.BackendCallsByOp[bench.OpEvalSHA] > u.Decisions ||
			u.BackendCallsPerDecision == nil || *u.BackendCallsPerDecision <= 0:
			t.Errorf("redis round %d: round trips %v over %v decisions", rec.Round, u.BackendCallsByOp, u.Decisions)
		case rec.P50 < 2000:
			t.Errorf("redis round %d: p50 %vµs, under the 2ms added to each round trip", rec.Round, rec.P50)
		}
	}
	// Round 1 runs noop, memory, redis; round 2 the reverse.
	if r1, r2 := recs["redis"][0], recs["redis"][1]; !recs["noop"][0].Time.Before(r1.Time) || !r2.Time.Before(recs["noop"][1].Time) {
		t.Errorf("redis ran at %v and %v, noop at %v and %v: want redis last, then first", r1.Time, r2.Time, recs["noop"][0].Time, recs["noop"][1].Time)
	}
	for _, want := range []string{"ratio of median throughputs redis/memory", "redis/noop", "redis round trips per decision", "(Scripts + CacheMisses)/decision"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
}

// With -redis, compare mode starts a redis-server of its own and stops it
// at the end; -redis-coalesce=false turns the backend's coalescing off.
func TestCompareOwnRedis(t *testing.T) {
	redistest.Require(t) // skips without redis-server
	recs, report := compareRecords(t, "-redis", "-redis-coalesce=false", "-rounds", "1", "-duration", "50ms", "-warmup", "0", "-concurrency", "4", "-conns", "1")
	if len(recs["redis"]) != 1 || recs["redis"][0].OK == 0 || recs["redis"][0].Config.Redis != "redis-server" {
		t.Fatalf("records %+v: want one redis run, answered", recs["redis"])
	}
	// Without coalescing, each decision on the one key is a script run
	// of its own.
	rec := recs["redis"][0]
	if c := rec.Config.RedisCoalesce; c == nil || *c || rec.Metrics.BackendCallsByOp[bench.OpEvalSHA] != rec.Metrics.Decisions {
		t.Errorf("coalescing %v: %v script runs for %v decisions, want one each", c, rec.Metrics.BackendCallsByOp, rec.Metrics.Decisions)
	}
	if !strings.Contains(report, "redis-server at 127.0.0.1:") {
		t.Errorf("report does not say where Redis ran:\n%s", report)
	}
}
