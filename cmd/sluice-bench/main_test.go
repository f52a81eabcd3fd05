package main

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/memory"
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
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{
		"-addr", addr, "-metrics", metrics, "-domain", bench.Domain, "-descriptor", bench.Key + "=k",
		"-over-limit", "0.5", "-over-descriptor", bench.OverKey + "=x", "-keys", "10", "-dist", "zipf",
		"-concurrency", "4", "-conns", "1", "-requests", "300", "-duration", "1m", "-warmup", "0", "-json",
	}, &stdout, &stderr)
	if code != 0 {
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
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("report on stderr lacks %q:\n%s", want, stderr.String())
		}
	}
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
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{
		"-addr", addr, "-metrics", metrics, "-domain", bench.Domain, "-descriptor", bench.Key + "=k",
		"-rate", "500", "-duration", "400ms", "-warmup", "0", "-concurrency", "8", "-conns", "1", "-json",
	}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var rec record
	if err := json.NewDecoder(&stdout).Decode(&rec); err != nil {
		t.Fatalf("stdout is not a JSON record: %v\n%s", err, stdout.String())
	}
	if rec.Config.Rate != 500 || rec.Scheduled != 200 || rec.Requests+rec.Dropped != 200 || rec.Metrics == nil ||
		rec.Metrics.Decisions != float64(rec.OK+rec.OverLimit) {
		t.Fatalf("record %+v: want 200 calls due at 500/s over 400ms, each sent or dropped, each sent one decision", rec)
	}
	if !strings.Contains(stderr.String(), "open loop at 500 calls/s") || !strings.Contains(stderr.String(), "200 calls due") {
		t.Errorf("report on stderr does not describe the open loop:\n%s", stderr.String())
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
