// Package backendtest drives backends as a fleet of Envoys does, for the
// tests of every backend.
package backendtest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
)

// Decider is what Storm calls: a backend.
type Decider interface {
	Decide(ctx context.Context, req *backend.Request) (backend.Decision, error)
}

// StormResult counts a storm's calls by answer. Late counts the calls
// answered more than the storm's late margin after their deadline, and
// Waited those that took more than half their budget, whatever the
// answer; FirstErr is the first error, "" for none.
type StormResult struct {
	Admitted, Denied, Failed, Late, Waited int64
	FirstErr                               string
}

// Total is the number of calls answered.
func (r StormResult) Total() int64 { return r.Admitted + r.Denied + r.Failed }

func (r StormResult) String() string {
	return fmt.Sprintf("admitted %d, denied %d, failed %d (first: %q), late %d, over half their budget %d", r.Admitted, r.Denied, r.Failed, r.FirstErr, r.Late, r.Waited)
}

// Storm runs callers goroutines on each of ds, each deciding req again and
// again for run, every call with budget before its deadline and a
// millisecond's pause after it (Envoys, not a spin: the machine keeps
// some room). A call answered more than late past its budget counts late.
func Storm(ds []Decider, req backend.Request, callers int, run, budget, late time.Duration) StormResult {
	var admitted, denied, failed, lateCalls, waited atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	end := time.Now().Add(run)
	for _, d := range ds {
		for range callers {
			wg.Go(func() {
				for time.Now().Before(end) {
					ctx, cancel := context.WithTimeout(context.Background(), budget)
					began := time.Now()
					r := req
					dec, err := d.Decide(ctx, &r)
					cancel()
					took := time.Since(began)
					if took > budget+late {
						lateCalls.Add(1)
					}
					if took > budget/2 {
						waited.Add(1)
					}
					switch {
					case err != nil:
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
					case dec.Allowed:
						admitted.Add(1)
					default:
						denied.Add(1)
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
	}
	wg.Wait()
	out := StormResult{Admitted: admitted.Load(), Denied: denied.Load(), Failed: failed.Load(), Late: lateCalls.Load(), Waited: waited.Load()}
	if e, ok := firstErr.Load().(string); ok {
		out.FirstErr = e
	}
	return out
}

// AtTheLimit checks what a storm on one key at its limit must give,
// whatever the backend: got admitted tokens (priming calls included)
// never over bound, at least 0.75 of reachable (the burst and the
// refill over the storm itself, plus the priming calls), no call left
// to the failure policy, and at most 1% of calls answered late. The
// storm's own span, which starts after the priming calls took their
// leases, admits no more than B + R*T + 1 either (reachable less 2, for
// tests that prime with three calls or fewer): the leases the priming
// left out count against the burst.
func (r StormResult) AtTheLimit(t testing.TB, got, bound, reachable float64) {
	t.Helper()
	if got > bound {
		t.Errorf("admitted %.0f, over the bound %.0f", got, bound)
	}
	if span := reachable - 2; float64(r.Admitted) > span {
		t.Errorf("the storm admitted %d, over B + R*T + 1 = %.0f over its own span", r.Admitted, span)
	}
	if got < 0.75*reachable {
		t.Errorf("admitted %.0f, under 0.75 of the burst and the load's own refill, %.0f", got, reachable)
	}
	if r.Failed > 0 {
		t.Errorf("%d of %d calls failed (first: %v), want none", r.Failed, r.Total(), r.FirstErr)
	}
	if r.Late > r.Total()/100 {
		t.Errorf("%d of %d calls answered past their deadline, want at most 1%%", r.Late, r.Total())
	}
}

// PacedResult counts a paced load's calls by answer, with the time each
// took, sorted.
type PacedResult struct {
	StormResult
	Took []time.Duration
}

// Quantile returns the time that the fraction q of the calls took at
// most.
func (r PacedResult) Quantile(q float64) time.Duration {
	if len(r.Took) == 0 {
		return 0
	}
	return r.Took[int(q*float64(len(r.Took)-1))]
}

// Over counts the calls that took longer than d.
func (r PacedResult) Over(d time.Duration) int {
	n, _ := slices.BinarySearch(r.Took, d+1)
	return len(r.Took) - n
}

func (r PacedResult) String() string {
	return fmt.Sprintf("%v; p50 %v, p99 %v, slowest %v", r.StormResult, r.Quantile(0.5), r.Quantile(0.99), r.Quantile(1))
}

// Paced sends rate calls a second of req for run, as Envoys in front of
// independent clients do (open loop: a call goes out on time whatever
// the calls before it are doing), spread over ds in turn, each call
// with budget before its deadline.
func Paced(ds []Decider, req backend.Request, rate int, run, budget time.Duration) PacedResult {
	var mu sync.Mutex
	var out PacedResult
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	end := time.Now().Add(run)
	for i := 0; time.Now().Before(end); i++ {
		<-tick.C
		d := ds[i%len(ds)]
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			r := req
			began := time.Now()
			dec, err := d.Decide(ctx, &r)
			took := time.Since(began)
			mu.Lock()
			defer mu.Unlock()
			out.Took = append(out.Took, took)
			switch {
			case err != nil:
				out.Failed++
				if out.FirstErr == "" {
					out.FirstErr = err.Error()
				}
			case dec.Allowed:
				out.Admitted++
			default:
				out.Denied++
			}
			if took > budget/2 {
				out.Waited++
			}
		})
	}
	wg.Wait()
	slices.Sort(out.Took)
	return out
}
