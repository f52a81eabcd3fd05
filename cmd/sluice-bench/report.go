package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/bench"
)

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
