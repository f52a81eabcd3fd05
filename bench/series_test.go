package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// writesPage is a replica's /metrics page after decisions and DynamoDB
// writes (UpdateItem and PutItem, a TransactWriteItems, and a read that
// is no write).
func writesPage(decisions, updates float64) string {
	return fmt.Sprintf(`# TYPE sluice_backend_call_duration_seconds histogram
sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="decide"} %g
sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="UpdateItem"} %g
sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="PutItem"} 2
sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="TransactWriteItems"} 1
sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="GetItem"} 5
# TYPE sluice_dynamodb_lease_writes_total counter
sluice_dynamodb_lease_writes_total %g
`, decisions, updates, updates/2)
}

// TestSeriesResult builds the windows of a run from its counts and the
// scrapes at its boundaries, without running anything: each window's
// writes are the difference of the scrapes around it, a failed scrape
// leaves its window without metrics and the next window spans both, the
// last window runs to the end of the run with the scrape after it, and
// the windows add up to the run.
func TestSeriesResult(t *testing.T) {
	sc := newScraper([]string{"http://127.0.0.1:1/metrics"})
	cfg := Config{Duration: 4 * time.Second, Series: time.Second}
	s := newSeries(cfg, sc, parse(t, writesPage(0, 0)))
	for i, n := range []uint64{10, 20, 30, 40} {
		s.windows[i].requests, s.windows[i].ok = n, n
	}
	s.windows[3].requests += 2
	s.windows[3].errors, s.windows[3].pastDeadline = 2, 2
	snap := func(decisions, updates float64) *Snapshot {
		p := parse(t, writesPage(decisions, updates))
		return &p
	}
	// Boundary 1 at 1.0s, 2 failed, 3 at 3.1s; the run ended at 4.2s
	// and was scraped after at 4.25s.
	s.snaps[1], s.at[1] = snap(10, 8), time.Second
	s.errs[2], s.at[2] = errors.New("connection refused"), 2*time.Second
	s.snaps[3], s.at[3] = snap(60, 50), 3100*time.Millisecond
	after := snap(100, 80)
	ws := s.result(4200*time.Millisecond, after, 4250*time.Millisecond, 1)

	if len(ws) != 4 {
		t.Fatalf("%d windows, want 4: %+v", len(ws), ws)
	}
	for i, w := range ws {
		wantEnd := time.Duration(i+1) * time.Second
		if i == 3 {
			wantEnd = 4200 * time.Millisecond
		}
		if w.Start != time.Duration(i)*time.Second || w.End != wantEnd {
			t.Errorf("window %d: %v to %v, want %v to %v", i, w.Start, w.End, time.Duration(i)*time.Second, wantEnd)
		}
	}
	// Writes: the scrapes' UpdateItem counts moved 0 -> 8 -> (failed)
	// -> 50 -> 80; PutItem, TransactWriteItems and GetItem never moved.
	type want struct {
		writes, decisions float64
		from, to          time.Duration
	}
	for i, wnt := range map[int]want{
		0: {8, 10, 0, time.Second},
		2: {42, 50, time.Second, 3100 * time.Millisecond},
		3: {30, 40, 3100 * time.Millisecond, 4250 * time.Millisecond},
	} {
		u := ws[i].Usage
		if u == nil {
			t.Errorf("window %d: no usage", i)
			continue
		}
		if u.Writes != wnt.writes || u.Decisions != wnt.decisions || ws[i].MetricsFrom != wnt.from || ws[i].MetricsTo != wnt.to {
			t.Errorf("window %d: %v writes, %v decisions, metrics %v to %v; want %+v", i, u.Writes, u.Decisions, ws[i].MetricsFrom, ws[i].MetricsTo, wnt)
		}
		if u.LeaseWrites == nil || *u.LeaseWrites != wnt.writes/2 {
			t.Errorf("window %d: lease writes %v, want %v", i, orNil(u.LeaseWrites), wnt.writes/2)
		}
	}
	if ws[1].Usage != nil || ws[1].ScrapeError == nil || !strings.Contains(ws[1].ScrapeError.Error(), "refused") {
		t.Errorf("window 1 (its closing scrape failed): usage %+v, error %v", ws[1].Usage, ws[1].ScrapeError)
	}
	var writes, calls, ok, errs, past uint64
	for _, w := range ws {
		if w.Usage != nil {
			writes += uint64(w.Usage.Writes)
		}
		calls, ok, errs, past = calls+w.Requests, ok+w.OK, errs+w.Errors, past+w.PastDeadline
	}
	if writes != 80 || calls != 102 || ok != 100 || errs != 2 || past != 2 {
		t.Errorf("windows add up to %d writes, %d calls, %d OK, %d errors, %d past the deadline; want 80, 102, 100, 2, 2", writes, calls, ok, errs, past)
	}
	if w := ws[0]; w.Throughput != 10 {
		t.Errorf("window 0: %v decisions/s, want 10", w.Throughput)
	}
	if w := ws[3]; w.Throughput < 40/1.2-0.01 || w.Throughput > 40/1.2+0.01 {
		t.Errorf("window 3 (1.2 s long): %v decisions/s, want %v", w.Throughput, 40/1.2)
	}

	// A run ended early (a count bound) leaves out the windows it never
	// reached; the scrape after it closes the last one it did.
	s = newSeries(cfg, sc, parse(t, writesPage(0, 0)))
	s.windows[0].requests = 5
	s.snaps[1], s.at[1] = snap(3, 3), time.Second // taken as the run ended
	ws = s.result(999*time.Millisecond, snap(5, 4), time.Second, 1)
	if len(ws) != 1 || ws[0].End != 999*time.Millisecond || ws[0].Usage == nil || ws[0].Usage.Writes != 4 {
		t.Fatalf("early end: %+v, want one window to 999ms with 4 writes", ws)
	}
}

// fakePages serves a /metrics page whose counters move by a known step
// at every scrape, and remembers what it served, in order.
type fakePages struct {
	mu     sync.Mutex
	served []float64 // the UpdateItem count of each page served
}

func (f *fakePages) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	f.mu.Lock()
	k := float64(len(f.served))
	updates := 3*k + k*k // steps of 4, 6, 8, ...: each window's own
	f.served = append(f.served, updates)
	f.mu.Unlock()
	fmt.Fprint(w, writesPage(100*k, updates))
}

// TestRunSeries drives two targets with a series and a /metrics page
// that moves at every scrape: the windows cover the run end to end, add
// up to its totals, and each window's writes are the difference of the
// pages scraped at its two ends.
func TestRunSeries(t *testing.T) {
	addrs := []string{serve(t, NoopServer{}), serve(t, NoopServer{})}
	pages := &fakePages{}
	page := httptest.NewServer(pages)
	t.Cleanup(page.Close)
	const windows = 4
	r, err := Run(t.Context(), Config{Addrs: addrs, Metrics: []string{page.URL + "/metrics"}, Concurrency: 4, Conns: 1,
		Duration: windows * 150 * time.Millisecond, Series: 150 * time.Millisecond, Workload: SingleKey()})
	if err != nil {
		t.Fatal(err)
	}
	ws := r.Series
	if len(ws) != windows {
		t.Fatalf("%d windows over %v, want %d", len(ws), r.Elapsed, windows)
	}
	var calls, ok, over, errs uint64
	for i, w := range ws {
		if w.Start != time.Duration(i)*150*time.Millisecond || (i > 0 && w.Start != ws[i-1].End) {
			t.Errorf("window %d starts at %v", i, w.Start)
		}
		calls, ok, over, errs = calls+w.Requests, ok+w.OK, over+w.OverLimit, errs+w.Errors
	}
	if last := ws[windows-1].End; last != r.Elapsed {
		t.Errorf("the last window ends at %v, the run at %v", last, r.Elapsed)
	}
	if calls != r.Requests || ok != r.OK || over != r.OverLimit || errs != r.Errors || calls == 0 {
		t.Errorf("windows add up to %d calls (%d OK, %d over, %d errors), the run had %d (%d, %d, %d)",
			calls, ok, over, errs, r.Requests, r.OK, r.OverLimit, r.Errors)
	}

	// The pages served: the scrape before the run, one per boundary it
	// reached (a loaded machine may miss some), and the one after.
	pages.mu.Lock()
	served := slices.Clone(pages.served)
	pages.mu.Unlock()
	var got []float64
	var sum float64
	for _, w := range ws {
		if w.Usage != nil {
			got = append(got, w.Usage.Writes)
			sum += w.Usage.Writes
		}
	}
	var want []float64
	for k := 1; k < len(served); k++ {
		want = append(want, served[k]-served[k-1])
	}
	if !slices.Equal(got, want) {
		t.Errorf("windows' writes %v; the pages served UpdateItem counts %v, whose steps are %v", got, served, want)
	}
	if r.Usage == nil || sum != r.Usage.Writes || r.Usage.Writes != served[len(served)-1] {
		t.Errorf("windows' writes sum to %v; the run's %+v", sum, r.Usage)
	}
	if len(got) < 2 {
		t.Errorf("%d windows with metrics of %d: the boundaries were not scraped", len(got), windows)
	}
}

// TestRunSeriesDeadlines counts the calls past their deadline in the
// window they failed in, and in the run.
func TestRunSeriesDeadlines(t *testing.T) {
	addr := serve(t, sleepyServer{delay: 200 * time.Millisecond})
	r, err := Run(t.Context(), Config{Addrs: []string{addr}, Concurrency: 4, Conns: 1, Duration: 300 * time.Millisecond,
		Timeout: 10 * time.Millisecond, Series: 100 * time.Millisecond, Workload: SingleKey()})
	if err != nil {
		t.Fatal(err)
	}
	var past, errs uint64
	for _, w := range r.Series {
		past, errs = past+w.PastDeadline, errs+w.Errors
		if w.Usage != nil {
			t.Errorf("window %+v has usage without metrics", w)
		}
	}
	if r.PastDeadline != r.Errors || r.Errors == 0 || past != r.PastDeadline || errs != r.Errors || len(r.Series) != 3 {
		t.Errorf("run: %d errors, %d past the deadline; %d windows: %d and %d", r.Errors, r.PastDeadline, len(r.Series), errs, past)
	}
}

// recordingServer remembers, for each call in order, its descriptor's
// first key and whether it carried a deadline.
type recordingServer struct {
	NoopServer
	mu    sync.Mutex
	calls []seenCall
}

type seenCall struct {
	key      string
	deadline bool
}

func (s *recordingServer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	_, deadline := ctx.Deadline()
	s.mu.Lock()
	s.calls = append(s.calls, seenCall{req.GetDescriptors()[0].GetEntries()[0].GetKey(), deadline})
	s.mu.Unlock()
	return s.NoopServer.ShouldRateLimit(ctx, req)
}

// TestRunPrime checks that Prime sends each target exactly one call
// without a deadline, on the workload's key, after the probes and before
// any other call of the workload; that the probes carry ProbeKey, never
// the workload's key; and that the result says what the priming calls
// got and how long before the run they were sent.
func TestRunPrime(t *testing.T) {
	servers := []*recordingServer{{}, {}, {}}
	var addrs []string
	for _, s := range servers {
		addrs = append(addrs, serve(t, s))
	}
	r, err := Run(t.Context(), Config{Addrs: addrs, Concurrency: 6, Conns: 2, Duration: time.Minute, Requests: 60,
		Warmup: 30 * time.Millisecond, Timeout: time.Minute, Prime: true, Workload: SingleKey()})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range servers {
		s.mu.Lock()
		calls := slices.Clone(s.calls)
		s.mu.Unlock()
		probes := 0
		for _, c := range calls {
			if c.key != ProbeKey {
				break
			}
			probes++
		}
		if probes != 2 { // one per connection
			t.Errorf("target %d: %d probes first, want 2: %v", i, probes, calls)
			continue
		}
		rest := calls[probes:]
		if len(rest) < 1 || rest[0] != (seenCall{Key, false}) {
			t.Errorf("target %d: after the probes %v, want the priming call (%s, no deadline)", i, rest[:min(len(rest), 3)], Key)
			continue
		}
		for j, c := range rest[1:] {
			if c != (seenCall{Key, true}) {
				t.Errorf("target %d: call %d after the priming call is %+v, want %s with a deadline", i, j, c, Key)
				break
			}
		}
	}
	p := r.Prime
	if p == nil || p.Calls != 3 || p.OK != 3 || p.OverLimit != 0 || p.Took <= 0 || p.Lead < p.Took+30*time.Millisecond {
		t.Fatalf("prime %+v: want 3 calls, 3 OK, sent at least its time and the 30ms warmup before the run", p)
	}
	if r.Requests != 60 || r.OK != 60 {
		t.Errorf("run %+v: want 60 calls, all OK: the priming calls count in none of its totals", r)
	}

	// Without Prime no call goes out without a deadline.
	s := &recordingServer{}
	if _, err := Run(t.Context(), Config{Addrs: []string{serve(t, s)}, Concurrency: 2, Conns: 1, Duration: time.Minute, Requests: 10,
		Timeout: time.Minute, Workload: SingleKey()}); err != nil {
		t.Fatal(err)
	}
	for _, c := range s.calls {
		if c.key == Key && !c.deadline {
			t.Errorf("unprimed run: %+v", s.calls)
			break
		}
	}
}

// failingServer fails every call on the workload's key.
type failingServer struct{ NoopServer }

func (failingServer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.GetDescriptors()[0].GetEntries()[0].GetKey() == ProbeKey {
		return NoopServer{}.ShouldRateLimit(ctx, req)
	}
	return nil, status.Error(codes.Unavailable, "backend away")
}

// A priming call that fails fails the run before it starts.
func TestRunPrimeFails(t *testing.T) {
	addrs := []string{serve(t, NoopServer{}), serve(t, failingServer{})}
	_, err := Run(t.Context(), Config{Addrs: addrs, Duration: time.Minute, Requests: 10, Prime: true, Workload: SingleKey()})
	if err == nil || !strings.Contains(err.Error(), "priming call to "+addrs[1]) {
		t.Fatalf("Run with a failing priming call: %v", err)
	}
}
