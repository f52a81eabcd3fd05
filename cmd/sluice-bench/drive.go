package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/bench"
)

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
