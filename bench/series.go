package bench

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// MaxWindows bounds the windows of a series (Config.Series): each holds
// a latency histogram of its own, about 30 KB.
const MaxWindows = 1000

// Window is one stretch of a measured run (Config.Series): the calls
// answered in it, as the client saw them, and, with Config.Metrics, what
// the backend did in it.
type Window struct {
	// Start and End are the window's bounds, from the run's first call.
	// Windows are Config.Series long; the last ends with the run, so it
	// also holds the calls answered after Duration (those still in flight
	// when it ended), and is shorter when Duration is not a whole number
	// of windows or the run ended early.
	Start, End time.Duration
	// The calls answered (or failed) in the window: a call belongs to the
	// window in which its answer came back, which is close to when its
	// replica decided it. Requests, Errors, OK and OverLimit are as in
	// Result; PastDeadline counts the failed calls whose deadline
	// (Config.Timeout) passed first (DeadlineExceeded); Late, in an open
	// loop, those sent more than LateAfter after they were due.
	Requests, Errors, OK, OverLimit uint64
	PastDeadline, Late              uint64
	// Throughput is the answered calls per second of the window.
	Throughput float64
	// P50 and P99 are of the calls answered in the window.
	P50, P99 time.Duration
	// Usage is what the backend did between the scrapes of every
	// /metrics page at MetricsFrom and at MetricsTo (from the first call;
	// the scrape right before the first call is at 0): the scrape at the
	// window's end boundary (for the last window, the scrape after the
	// run) less the one at its start. Nil without Config.Metrics, or when
	// the scrape at its end failed (ScrapeError): the next window's Usage
	// then runs from the last scrape that worked, so that the windows'
	// Usage still add up to the run's.
	Usage                  *Usage
	MetricsFrom, MetricsTo time.Duration
	ScrapeError            error
}

// seriesWindow is one window's counts while the run goes on, shared by
// every worker: one lock per call, which at the few tens of thousands of
// calls a second this machine's loads reach costs nothing measurable.
type seriesWindow struct {
	mu                                             sync.Mutex
	requests, errors, ok, over, pastDeadline, late uint64
	hist                                           histogram
}

// series records a measured run in windows, and scrapes the fleet's
// /metrics at every window boundary.
type series struct {
	every   time.Duration
	windows []seriesWindow
	start   time.Time // the first call of the run, set by drive

	// With metrics: sc scrapes the pages, before is the scrape right
	// before the run, and snaps[k] the one at boundary k (k*every from
	// start; k = 1 ... len(windows)-1), at[k] when it started, errs[k]
	// why it failed.
	sc     *scraper
	before Snapshot
	snaps  []*Snapshot
	at     []time.Duration
	errs   []error
	// done ends the scraping when the run ends; scraped is closed when
	// the scraping has stopped.
	done, scraped chan struct{}
}

// numWindows is how many windows of every a run of d needs.
func numWindows(d, every time.Duration) int {
	return int((d + every - 1) / every)
}

func newSeries(cfg Config, sc *scraper, before Snapshot) *series {
	n := numWindows(cfg.Duration, cfg.Series)
	return &series{
		every: cfg.Series, windows: make([]seriesWindow, n),
		sc: sc, before: before,
		snaps: make([]*Snapshot, n), at: make([]time.Duration, n), errs: make([]error, n),
		done: make(chan struct{}), scraped: make(chan struct{}),
	}
}

// window is the window a call answered at now belongs to.
func (s *series) window(now time.Time) *seriesWindow {
	i := int(now.Sub(s.start) / s.every)
	return &s.windows[min(max(i, 0), len(s.windows)-1)]
}

// record counts one call answered at now: err is its error, or nil and
// ok or over its answer; lat its latency.
func (s *series) record(now time.Time, lat time.Duration, err error, ok, over, late bool) {
	w := s.window(now)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.requests++
	if late {
		w.late++
	}
	switch {
	case err != nil:
		w.errors++
		if status.Code(err) == codes.DeadlineExceeded {
			w.pastDeadline++
		}
		return
	case ok:
		w.ok++
	case over:
		w.over++
	}
	w.hist.record(lat)
}

// scrapeLoop scrapes every page at each window boundary until the run
// ends (done) or ctx does. A scrape that takes longer than a window
// delays the next one; the windows' Usage says which scrapes they span.
func (s *series) scrapeLoop(ctx context.Context) {
	defer close(s.scraped)
	if s.sc == nil {
		return
	}
	for k := 1; k < len(s.windows); k++ {
		t := time.NewTimer(time.Until(s.start.Add(time.Duration(k) * s.every)))
		select {
		case <-s.done:
			t.Stop()
			return
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		s.at[k] = time.Since(s.start)
		snap, err := s.sc.scrape(ctx)
		if err != nil {
			s.errs[k] = err
			continue
		}
		s.snaps[k] = &snap
	}
}

// result is the run's windows, the run having lasted elapsed from its
// first call. after is the scrape after the run (nil without metrics or
// when it failed), begun afterAt from the first call; pages is the
// number of /metrics pages each scrape sums.
func (s *series) result(elapsed time.Duration, after *Snapshot, afterAt time.Duration, pages int) []Window {
	// The windows the run reached: an early end (a count bound, a
	// cancelled context) leaves the rest empty, and they are left out.
	used := min(len(s.windows), int(elapsed/s.every)+1)
	for i := used; i < len(s.windows); i++ {
		if s.windows[i].requests > 0 {
			used = i + 1
		}
	}
	out := make([]Window, used)
	last, lastAt := &s.before, time.Duration(0)
	for i := range out {
		sw := &s.windows[i]
		w := Window{
			Start: time.Duration(i) * s.every, End: time.Duration(i+1) * s.every,
			Requests: sw.requests, Errors: sw.errors, OK: sw.ok, OverLimit: sw.over,
			PastDeadline: sw.pastDeadline, Late: sw.late,
			P50: sw.hist.quantile(0.50), P99: sw.hist.quantile(0.99),
		}
		if i == used-1 {
			w.End = max(elapsed, w.Start)
		}
		if d := (w.End - w.Start).Seconds(); d > 0 {
			w.Throughput = float64(w.Requests-w.Errors) / d
		}
		if s.sc != nil {
			// The scrape that closes this window: the one at its end
			// boundary, or for the last window the one after the run.
			closing, at, err := after, afterAt, error(nil)
			if i < used-1 {
				closing, at, err = s.snaps[i+1], s.at[i+1], s.errs[i+1]
				if closing == nil && err == nil {
					err = errors.New("not scraped: the run ended first")
				}
			}
			if closing != nil {
				u := closing.Sub(*last).Usage(w.OK, w.OverLimit)
				u.Pages = pages
				w.Usage, w.MetricsFrom, w.MetricsTo = &u, lastAt, at
				last, lastAt = closing, at
			} else {
				w.ScrapeError = err
			}
		}
		out[i] = w
	}
	return out
}
