package memory

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/backendtest"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/regions"
)

// fakeClock is a settable clock in epoch milliseconds.
type fakeClock struct{ ms atomic.Int64 }

func (c *fakeClock) now() int64       { return c.ms.Load() }
func (c *fakeClock) advance(ms int64) { c.ms.Add(ms) }

func newTestBackend(t *testing.T, opts Options) (*Backend, *fakeClock) {
	t.Helper()
	clk := &fakeClock{}
	clk.ms.Store(1_700_000_000_000)
	opts.Now = clk.now
	opts.SweepInterval = -1
	b := New(opts)
	t.Cleanup(func() { b.Close() })
	return b, clk
}

func limit(t *testing.T, spec string) bucket.Limit {
	t.Helper()
	name, rest, _ := strings.Cut(spec, "=")
	rate, burst, _ := strings.Cut(rest, ":")
	s := bucket.Spec{Name: name, Rate: rate}
	if burst != "" {
		var n int64
		fmt.Sscan(burst, &n)
		s.Burst = &n
	}
	l, err := s.Limit()
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func decide(t *testing.T, b *Backend, req backend.Request) backend.Decision {
	t.Helper()
	d, err := b.Decide(context.Background(), &req)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestBurstThenRefill(t *testing.T) {
	b, clk := newTestBackend(t, Options{})
	req := backend.Request{Entity: "1.2.3.4", Resource: "edge/remote_address", Defaults: []bucket.Limit{limit(t, "rpm=10/min")}, Hits: 1}
	for i := 0; i < 10; i++ {
		if d := decide(t, b, req); !d.Allowed {
			t.Fatalf("request %d of a burst of 10 denied", i+1)
		}
	}
	d := decide(t, b, req)
	if d.Allowed || d.Binding != 0 || d.Results[0].Wait != 6000 {
		t.Fatalf("11th request: %+v", d)
	}
	clk.advance(5999)
	if decide(t, b, req).Allowed {
		t.Fatal("admitted before the retry-after")
	}
	clk.advance(1)
	if !decide(t, b, req).Allowed {
		t.Fatal("denied after the retry-after")
	}
	// Another entity has its own bucket.
	other := req
	other.Entity = "5.6.7.8"
	if !decide(t, b, other).Allowed {
		t.Fatal("a second entity shares the first one's bucket")
	}
}

func TestResolutionOrderAndLevels(t *testing.T) {
	ov, err := ParseOverrides([]byte(`
system:
  limits: [{name: sys, rate: 1/s}]
resources:
  "api/tier=gold": {limits: [{name: res, rate: 2/s}]}
entities:
  acme:
    _default_: {limits: [{name: def, rate: 3/s}]}
    "api/special": {limits: [{name: ent, rate: 4/s}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := newTestBackend(t, Options{Overrides: ov})
	file := []bucket.Limit{limit(t, "file=5/s")}
	cases := []struct {
		entity, resource string
		defaults         []bucket.Limit
		want             string
		level            backend.Level
	}{
		{"acme", "api/special", file, "ent", backend.LevelEntity},
		{"acme", "api/other", file, "def", backend.LevelEntityDefault},
		{"zed", "api/tier=gold", file, "res", backend.LevelResource},
		{"zed", "api/other", file, "file", backend.LevelResource},
		{"zed", "api/other", nil, "sys", backend.LevelSystem},
	}
	for _, c := range cases {
		d := decide(t, b, backend.Request{Entity: c.entity, Resource: c.resource, Defaults: c.defaults, Hits: 1})
		if len(d.Limits) != 1 || d.Limits[0].Name != c.want || d.Level != c.level {
			t.Errorf("%s %s: got %v at %v, want %s at %v", c.entity, c.resource, d.Limits, d.Level, c.want, c.level)
		}
	}
	none, _ := newTestBackend(t, Options{})
	if d := decide(t, none, backend.Request{Entity: "x", Resource: "y", Hits: 1}); d.Limited() || !d.Allowed {
		t.Fatalf("no limits anywhere: %+v", d)
	}
}

func TestCascadeChargesParentAtomically(t *testing.T) {
	ov, err := ParseOverrides([]byte(`
entities:
  org:
    _default_: {limits: [{name: org, rate: 5/min}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := newTestBackend(t, Options{Overrides: ov})
	defaults := []bucket.Limit{limit(t, "key=10/min")}
	admitted := map[string]int{}
	for i := 0; i < 20; i++ {
		child := []string{"k1", "k2"}[i%2]
		if decide(t, b, backend.Request{Entity: child, Parent: "org", Resource: "api", Defaults: defaults, Hits: 1}).Allowed {
			admitted[child]++
		}
	}
	if admitted["k1"]+admitted["k2"] != 5 {
		t.Fatalf("children admitted %v past the parent's 5", admitted)
	}
	// The parent denied, so the children kept the tokens it refused.
	snap, ok := b.Snapshot("k1", "api")
	if !ok || snap.States[0].Tokens != int64(10-admitted["k1"])*bucket.Milli {
		t.Fatalf("child k1 state %+v after parent denials", snap)
	}
	d := decide(t, b, backend.Request{Entity: "k3", Parent: "org", Resource: "api", Defaults: defaults, Hits: 1})
	if d.Allowed || len(d.Limits) != 2 || d.Limits[d.Binding].Name != "org" || d.Level != backend.LevelResource {
		t.Fatalf("decision against an exhausted parent: %+v", d)
	}
}

func TestCascadeConcurrentPairsDoNotDeadlock(t *testing.T) {
	b, _ := newTestBackend(t, Options{})
	defaults := []bucket.Limit{limit(t, "x=1000000/s")}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			a, p := "a", "b"
			if g%2 == 1 {
				a, p = p, a
			}
			for i := 0; i < 2000; i++ {
				if _, err := b.Decide(context.Background(), &backend.Request{Entity: a, Parent: p, Resource: "r", Defaults: defaults, Hits: 1}); err != nil {
					t.Error(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
}

func TestConcurrentCallersAdmitExactlyTheBurst(t *testing.T) {
	b, _ := newTestBackend(t, Options{})
	defaults := []bucket.Limit{limit(t, "x=0/s:100")} // a burst of 100 that never refills
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 50; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				d, err := b.Decide(context.Background(), &backend.Request{Entity: "hot", Resource: "r", Defaults: defaults, Hits: 1})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != 100 {
		t.Fatalf("50 callers x 20 requests admitted %d, want the burst of 100", admitted.Load())
	}
}

// DESIGN's accuracy bar on one process: many concurrent callers on one
// key, burst B and rate R over T seconds admit at most B + R*T (+1 for
// rounding), and not far below it.
func TestAccuracyUnderConcurrency(t *testing.T) {
	b, clk := newTestBackend(t, Options{})
	defaults := []bucket.Limit{limit(t, "x=10/s:100")}
	var admitted atomic.Int64
	const callers, steps, stepMs = 50, 500, 20 // T = 10 s of simulated time
	for step := 0; step < steps; step++ {
		clk.advance(stepMs)
		var wg sync.WaitGroup
		for g := 0; g < callers; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d, err := b.Decide(context.Background(), &backend.Request{Entity: "hot", Resource: "r", Defaults: defaults, Hits: 1})
				if err != nil {
					t.Error(err)
				} else if d.Allowed {
					admitted.Add(1)
				}
			}()
		}
		wg.Wait()
	}
	const bound = 100 + 10*10 // B + R*T
	t.Logf("admitted %d of %d calls", admitted.Load(), callers*steps)
	if n := admitted.Load(); n > bound+1 || n < bound-10 {
		t.Fatalf("admitted %d, want within [%d, %d]", n, bound-10, bound+1)
	}
}

// Pitfalls 3 and 4: a changed resource limit reaches an existing bucket.
func TestChangedLimitsReachExistingBucket(t *testing.T) {
	b, _ := newTestBackend(t, Options{})
	req := backend.Request{Entity: "e", Resource: "r", Defaults: []bucket.Limit{limit(t, "rpm=10/min")}, Hits: 1}
	for i := 0; i < 10; i++ {
		decide(t, b, req)
	}
	if decide(t, b, req).Allowed {
		t.Fatal("burst not exhausted")
	}
	// Raised limit with a new second limit: the old one keeps its (empty)
	// tokens, so still denied by rpm; the added one starts full.
	req.Defaults = []bucket.Limit{limit(t, "rpm=20/min:20"), limit(t, "tpm=1000/min")}
	d := decide(t, b, req)
	if d.Allowed || d.Limits[d.Binding].Name != "rpm" || d.Results[1].Tokens != 1000*bucket.Milli {
		t.Fatalf("after adding tpm: %+v", d)
	}
	// Lowered to a zero rate: denied with the new limit reported.
	req.Defaults = []bucket.Limit{limit(t, "blocked=0/min")}
	d = decide(t, b, req)
	if d.Allowed || d.Limits[0].Name != "blocked" || len(d.Limits) != 1 {
		t.Fatalf("after lowering: %+v", d)
	}
}

func TestTTLBySource(t *testing.T) {
	ov, err := ParseOverrides([]byte(`
entities:
  vip:
    r: {limits: [{name: vip, rate: 10/s}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	var writes []time.Duration
	b, clk := newTestBackend(t, Options{Overrides: ov, TTLMultiplier: 7, OnBucketWrite: func(ttl time.Duration) { writes = append(writes, ttl) }})
	defaults := []bucket.Limit{limit(t, "fast=10/s"), limit(t, "slow=60/min:120")} // fills in 1 s and 120 s
	decide(t, b, backend.Request{Entity: "anon", Resource: "r", Defaults: defaults, Hits: 1})
	decide(t, b, backend.Request{Entity: "vip", Resource: "r", Defaults: defaults, Hits: 1})
	anon, _ := b.Snapshot("anon", "r")
	if want := clk.now() + 7*120_000; anon.Expires != want {
		t.Fatalf("default-sourced bucket expires at %d, want %d", anon.Expires, want)
	}
	vip, _ := b.Snapshot("vip", "r")
	if vip.Expires != 0 {
		t.Fatalf("operator-written entity bucket expires at %d, want never", vip.Expires)
	}
	// Every write moves the TTL; a denied decision writes nothing.
	clk.advance(1000)
	decide(t, b, backend.Request{Entity: "anon", Resource: "r", Defaults: defaults, Hits: 1})
	anon2, _ := b.Snapshot("anon", "r")
	if anon2.Expires != anon.Expires+1000 {
		t.Fatalf("ttl did not move on write: %d then %d", anon.Expires, anon2.Expires)
	}
	decide(t, b, backend.Request{Entity: "anon", Resource: "r", Defaults: defaults, Hits: 1000})
	if anon3, _ := b.Snapshot("anon", "r"); anon3.Expires != anon2.Expires {
		t.Fatal("a denied decision moved the ttl")
	}
	clk.advance(1000)
	decide(t, b, backend.Request{Entity: "anon", Resource: "r", Defaults: defaults, Hits: 0})
	if anon4, _ := b.Snapshot("anon", "r"); anon4.Expires != anon2.Expires {
		t.Fatal("a zero-hit check moved the ttl")
	}

	// Every write was reported with its TTL: three for anon, one for vip
	// (never expires); the denial and the check were no writes.
	if want := []time.Duration{14 * time.Minute, 0, 14 * time.Minute}; !slices.Equal(writes, want) {
		t.Errorf("writes reported %v, want %v", writes, want)
	}

	off, _ := newTestBackend(t, Options{TTLMultiplier: 0})
	decide(t, off, backend.Request{Entity: "anon", Resource: "r", Defaults: defaults, Hits: 1})
	if s, _ := off.Snapshot("anon", "r"); s.Expires != 0 {
		t.Fatal("TTL management off still set a ttl")
	}
}

// Pitfall 9: a bucket past its ttl counts as absent, even if still held.
func TestExpiredBucketCountsAsAbsent(t *testing.T) {
	b, clk := newTestBackend(t, Options{TTLMultiplier: 1})
	// A zero-rate limit with a burst never fills, so it gets no TTL; use a
	// slow one whose TTL (1 x time to fill) we can pass.
	req := backend.Request{Entity: "e", Resource: "r", Defaults: []bucket.Limit{limit(t, "x=1/hour:3")}, Hits: 3}
	if !decide(t, b, req).Allowed {
		t.Fatal("first burst denied")
	}
	s, _ := b.Snapshot("e", "r")
	clk.ms.Store(s.Expires)
	d := decide(t, b, req)
	if !d.Allowed || d.Results[0].Tokens != 0 {
		t.Fatalf("expired bucket not treated as absent: %+v", d)
	}
}

// A bucket in debt outlives its debt, however short the TTL: at
// multiplier 1 a limit that fills in a minute keeps its bucket two
// minutes after a charge took it a burst below zero, so a tenant that
// comes back after a minute and a half finds the debt still being
// repaid, not a new bucket given in full.
func TestBucketInDebtOutlivesItsDebt(t *testing.T) {
	b, clk := newTestBackend(t, Options{TTLMultiplier: 1})
	tpm := limit(t, "tpm=60/min")
	charge := backend.Request{Entity: "tenant", Resource: "chat", Defaults: []bucket.Limit{tpm}, Hits: 120, Charge: true}
	decide(t, b, charge)
	s, _ := b.Snapshot("tenant", "chat")
	if got := s.Expires - clk.now(); got != 2*bucket.Minute {
		t.Fatalf("a bucket charged to its floor expires %d ms on, want %d (the time to refill from the floor)", got, 2*bucket.Minute)
	}
	clk.advance(90 * bucket.Second)
	d := decide(t, b, backend.Request{Entity: "tenant", Resource: "chat", Defaults: []bucket.Limit{tpm}, Hits: 0})
	if left := d.Results[0].Tokens / bucket.Milli; left != 30 {
		t.Fatalf("90 s after a charge to 60 below zero the limit holds %d tokens, want 30 (the debt forgiven if more)", left)
	}
}

func TestMemoryBoundedUnderKeyFlood(t *testing.T) {
	b, clk := newTestBackend(t, Options{MaxBuckets: 6400})
	defaults := []bucket.Limit{limit(t, "x=1/hour:2")}
	hot := backend.Request{Entity: "hot", Resource: "r", Defaults: defaults, Hits: 2}
	if !decide(t, b, hot).Allowed {
		t.Fatal("hot key's first burst denied")
	}
	for i := 0; i < 200_000; i++ {
		decide(t, b, backend.Request{Entity: fmt.Sprintf("flood-%d", i), Resource: "r", Defaults: defaults, Hits: 1})
		if i%1000 == 0 {
			clk.advance(1)
			// The hot key stays in use, so the LRU keeps it (exhausted).
			if decide(t, b, hot).Allowed {
				t.Fatalf("hot key's state lost to the flood at %d", i)
			}
		}
	}
	if n := b.Len(); n > 6400 {
		t.Fatalf("%d buckets held, cap 6400", n)
	}
}

func TestSweepDropsOnlyIdleBuckets(t *testing.T) {
	b, clk := newTestBackend(t, Options{TTLMultiplier: 7})
	defaults := []bucket.Limit{limit(t, "x=10/s")}
	decide(t, b, backend.Request{Entity: "busy", Resource: "r", Defaults: defaults, Hits: 10})
	decide(t, b, backend.Request{Entity: "idle", Resource: "r", Defaults: defaults, Hits: 1})
	clk.advance(500) // idle has refilled; busy has 5 of 10
	b.Sweep()
	if _, ok := b.Snapshot("idle", "r"); ok {
		t.Fatal("a refilled bucket survived the sweep")
	}
	s, ok := b.Snapshot("busy", "r")
	if !ok || s.States[0].Tokens != 0 {
		t.Fatalf("a bucket still refilling was dropped: %+v %v", s, ok)
	}
}

func TestOverridesErrors(t *testing.T) {
	cases := map[string]string{
		"unknown key":    "system:\n  limitz: []\n",
		"bad rate":       "system:\n  limits: [{name: a, rate: 10}]\n",
		"duplicate name": "system:\n  limits: [{name: a, rate: 1/s}, {name: a, rate: 2/s}]\n",
		"bad cost":       "resources:\n  r: {limits: [{name: a, rate: 1/s, cost: tokens}]}\n",
		"no name":        "entities:\n  e:\n    r: {limits: [{rate: 1/s}]}\n",
		"negative burst": "system:\n  limits: [{name: a, rate: 1/s, burst: -1}]\n",
	}
	for name, text := range cases {
		if _, err := ParseOverrides([]byte(text)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := ParseOverrides([]byte("system:\n  limitz: []\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("unknown key error does not name the line: %v", err)
	}
}

func TestCancelledContext(t *testing.T) {
	b, _ := newTestBackend(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Decide(ctx, &backend.Request{Entity: "e", Resource: "r", Hits: 1}); err == nil {
		t.Fatal("a cancelled request was decided")
	}
}

// TestGlobalLimitSplitByRegion: a memory replica in a region weighted 1
// of 4 enforces a quarter of a global limit, and a rule not global whole.
// euWestQuarter is a replica's view of global limits split 3:1 between
// us-east-1 and eu-west-1, from eu-west-1: a quarter of each.
func euWestQuarter(t *testing.T) backend.Global {
	return backendtest.FixedGlobal(t, map[regions.Region]int64{"us-east-1": 3, "eu-west-1": 1}, "eu-west-1")
}

func TestGlobalLimitSplitByRegion(t *testing.T) {
	b, _ := newTestBackend(t, Options{Global: euWestQuarter(t)})
	l := []bucket.Limit{limit(t, "rps=400/s")}
	for _, c := range []struct {
		global bool
		want   int
	}{{true, 100}, {false, 400}} {
		admitted := 0
		for range 500 {
			d, err := b.Decide(context.Background(), &backend.Request{Entity: "t", Resource: fmt.Sprint(c.global), Defaults: l, Hits: 1, Global: c.global})
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != c.want {
			t.Errorf("global %v: admitted %d, want %d", c.global, admitted, c.want)
		}
	}
	split, err := regions.NewSplit(map[regions.Region]int64{"us-east-1": 3, "eu-west-1": 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := backend.NewGlobal(split, "mars"); err == nil {
		t.Error("NewGlobal took a region not in the split")
	}
}
