package syncer_test

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	ddb "github.com/sluice-rl/sluice/backend/dynamodb"
	"github.com/sluice-rl/sluice/backend/dynamodb/dynamodbtest"
	"github.com/sluice-rl/sluice/backend/lease"
	"github.com/sluice-rl/sluice/internal/callgate"
	"github.com/sluice-rl/sluice/regions"
	"github.com/sluice-rl/sluice/regions/syncer"
)

var (
	long     = flag.Bool("regions.long", false, "run the regions' world at full size (make soak): 10 s windows, 1,000/s, faults")
	gateAB   = flag.Bool("regions.gateab", false, "let the syncs' usage queries through their gates (internal/callgate) in every other window only, and log the decisions' latencies of the windows with and without, side by side (BENCHMARKS.md section 6)")
	baseline = flag.Bool("regions.baseline", false, "run the world with shares that never move (serve's --global-window 0) and no syncs: each region at its base, the in-region baseline for latency; use and following demand are logged, not checked")
)

// A world is three regions, each with a DynamoDB Local of its own, two
// replicas and a sync, sharing one global limit. A region's replicas and
// sync reach its table through a proxy that delays each call by near;
// its sync reaches the other regions' tables through proxies of their
// own that delay by far. The clocks of the regions are skewed: us-east-1
// runs Skew/2 ahead, ap-south-1 Skew/2 behind. Demand is a rate of
// requests per region, each request deciding one hit of the key; every
// admission is counted in 100 ms ticks by when its decision began.
type world struct {
	t     *testing.T
	clock regions.Clock
	split regions.Split
	names []regions.Region
	limit bucket.Limit
	rate  float64 // tokens a second
	key   regions.Key
	// deadline is each call's, as Envoy's timeout is.
	deadline time.Duration
	start    time.Time
	region   map[regions.Region]*region
}

type region struct {
	name     regions.Region
	offset   int64 // ms its clocks run ahead of the world's
	near     *dynamodbtest.Proxy
	far      map[regions.Region]*dynamodbtest.Proxy // its sync's, to the others
	replicas []*ddb.Backend
	syncs    []*runningSync
	demand   atomic.Int64 // requests a second
	admitted []atomic.Int64
	asked    []atomic.Int64
	failed   []atomic.Int64
	slow     atomic.Int64 // decisions that took 50 ms or more
	errs     atomic.Int64
	firstErr atomic.Value
	kindsMu  sync.Mutex
	kinds    map[string]int // failed decisions by the start of their error
	lat      latencies

	newSync func() *syncer.Sync
}

type runningSync struct {
	cancel context.CancelFunc
	done   chan struct{}
	errs   atomic.Int64 // unread, refused and failed, over its rounds
	rounds atomic.Int64
	wrote  atomic.Int64
}

// latencies keeps every decision's latency and the tick it began in, for
// percentiles.
type latencies struct {
	mu   sync.Mutex
	d    []time.Duration
	tick []int
	kind []outcome
}

// outcome is how a decision ended.
type outcome uint8

const (
	wasAdmitted outcome = iota
	wasDenied
	wasFailed
)

func (l *latencies) add(n int, d time.Duration, o outcome) {
	l.mu.Lock()
	l.d, l.tick, l.kind = append(l.d, d), append(l.tick, n), append(l.kind, o)
	l.mu.Unlock()
}

// slowOf counts the decisions of at least d whose tick keep keeps, by
// how they ended.
func (l *latencies) slowOf(d time.Duration, keep func(tick int) bool) (by [3]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, x := range l.d {
		if x >= d && keep(l.tick[i]) {
			by[l.kind[i]]++
		}
	}
	return by
}

func (l *latencies) quantile(q float64) time.Duration {
	return l.quantileOf(q, func(int) bool { return true })
}

// quantileOf is the q quantile of the decisions whose tick keep keeps.
func (l *latencies) quantileOf(q float64, keep func(tick int) bool) time.Duration {
	l.mu.Lock()
	var s []time.Duration
	for i, d := range l.d {
		if keep(l.tick[i]) {
			s = append(s, d)
		}
	}
	l.mu.Unlock()
	if len(s) == 0 {
		return 0
	}
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

const tick = 100 * time.Millisecond

// quoted finds the key in an error, to count errors by kind.
var quoted = regexp.MustCompile(`"[^"]*"`)

type worldConfig struct {
	clock     regions.Clock
	rate      string // of the limit, e.g. "200/s" (burst the same)
	near, far time.Duration
	// The schedule, in windows from the start: the shift of demand, the
	// 60 s partition of ap-south-1 and the 60 s outage of us-east-1's
	// syncs (0: none), and the end.
	shift, partition, kill, end int
	// minUse is the least part of the rate a window outside the warm-up,
	// shift and faults must admit, and settle how many windows after them
	// are left out: the targets, 0.9 and 3, at full size; 0.85 and 4 in
	// make test, whose shorter windows leave a machine busy with the race
	// detector and other tests too little time to plan a window's loans
	// before its deadline, now and then (they then start a window later).
	minUse float64
	settle int
	// deadline is each call's: Envoy's 50 ms (the example envoy.yaml's)
	// at full size; 1 s in make test, where the emulator shares two
	// cores with the rest of the suite and answers in tens of ms at times.
	// maxFailed is the part of a region's calls that may fail (past their
	// deadline): a thousandth at full size; two hundredths in make test,
	// where a call on those cores beside the race detector and two busy
	// loops took up to a second now and then (19 of 3,071 in one run).
	deadline  time.Duration
	maxFailed float64
	// coldFailed, when set, is the part of a region's calls in the first
	// window that may fail, and maxFailed holds the rest of the run apart
	// from it; 0: the first window counts with the rest (make test, whose
	// first window holds a few dozen calls in a light region). At full
	// size about 180 of the heavy region's 12,000 (1.5%) failed there,
	// most with a deadline nearer than the table's round trip as its cold
	// JVM measured it, against 35 in the whole run of the baseline, whose
	// replicas read no share record and whose regions run no sync.
	coldFailed float64
	// baseline: shares never move and no sync runs (-regions.baseline).
	baseline bool
	// replicas is each region's (0: two).
	replicas int
	// gateAB lets the syncs' queries through their gates in the windows
	// of even slots only (-regions.gateab); otherwise always, as sluice
	// sync does.
	gateAB bool
}

func newWorld(t *testing.T, c worldConfig) *world {
	t.Helper()
	split, err := regions.NewSplit(map[regions.Region]int64{"us-east-1": 1, "eu-west-1": 1, "ap-south-1": 1})
	if err != nil {
		t.Fatal(err)
	}
	l, err := (&bucket.Spec{Name: "rps", Rate: c.rate}).Limit()
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, clock: c.clock, split: split, names: split.Regions(), limit: l,
		rate: float64(l.Amount) / float64(l.Period), key: regions.Key{Entity: "tenant-1", Resource: "api"}, deadline: c.deadline,
		region: map[regions.Region]*region{}}
	offsets := map[regions.Region]int64{"us-east-1": c.clock.Skew / 2, "eu-west-1": 0, "ap-south-1": -c.clock.Skew / 2}
	// One DynamoDB Local holds every region's table, each behind proxies
	// of its own: three emulators would be three JVMs compiling on the
	// same two cores, and a region's decisions would wait for the
	// machine rather than for its table.
	srv := dynamodbtest.RequireOwn(t, dynamodbtest.Options{})
	servers := map[regions.Region]*dynamodbtest.Server{}
	tables := map[regions.Region]string{}
	for _, name := range w.names {
		servers[name] = srv
		tables[name] = srv.NewTable(t, func(ctx context.Context, c *dynamodb.Client, name string) error {
			_, err := ddb.CreateTable(ctx, c, name)
			return err
		})
	}
	proxy := func(to regions.Region, d time.Duration) *dynamodbtest.Proxy {
		p, err := dynamodbtest.NewProxy(strings.TrimPrefix(servers[to].Endpoint(), "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		p.SetDelay(d)
		return p
	}
	ticks := c.end*int(time.Duration(c.clock.Window)*time.Millisecond/tick) + 100
	for _, name := range w.names {
		r := &region{name: name, offset: offsets[name], far: map[regions.Region]*dynamodbtest.Proxy{}, kinds: map[string]int{},
			admitted: make([]atomic.Int64, ticks), asked: make([]atomic.Int64, ticks), failed: make([]atomic.Int64, ticks)}
		now := func() int64 { return time.Now().UnixMilli() + r.offset }
		r.near = proxy(name, c.near)
		g, err := backend.NewGlobal(split, name)
		if err != nil {
			t.Fatal(err)
		}
		if !c.baseline {
			if g, err = g.Moving(c.clock); err != nil {
				t.Fatal(err)
			}
		}
		for range cmp.Or(c.replicas, 2) {
			b, err := ddb.New(servers[name].ClientAt(r.near.Endpoint()), ddb.Options{Table: tables[name], Global: g, Now: now})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			r.replicas = append(r.replicas, b)
		}
		stores := map[regions.Region]syncer.Store{}
		for _, other := range w.names {
			p := r.near
			if other != name {
				p = proxy(other, c.far)
				r.far[other] = p
			}
			// As sluice sync opens its stores: queries a few at a time.
			client := servers[other].ClientAt(p.Endpoint())
			api := callgate.DynamoDB(client, callgate.New(callgate.SyncQueries))
			if c.gateAB {
				api = abQueries{AdminAPI: api, open: client, gated: func() bool { return c.clock.At(now())%2 == 0 }}
			}
			a, err := ddb.NewAdmin(api, tables[other], "", now)
			if err != nil {
				t.Fatal(err)
			}
			stores[other] = a
		}
		r.newSync = func() *syncer.Sync {
			return &syncer.Sync{Me: name, Split: split, Clock: c.clock, Stores: stores, Budget: syncer.DefaultBudget(c.clock), Now: now}
		}
		w.region[name] = r
	}
	w.warm()
	return w
}

// warm runs a few seconds of decisions of a key not global through every
// replica before the world starts: a DynamoDB Local fresh from its start
// answers its first calls in up to a second while its JVM compiles, which
// a table in AWS does not.
func (w *world) warm() {
	var wg sync.WaitGroup
	for _, r := range w.region {
		for _, b := range r.replicas {
			for i := range 4 {
				wg.Go(func() {
					for j := range 150 {
						b.Decide(context.Background(), &backend.Request{Entity: fmt.Sprintf("warm-%d", (i*150+j)%20), Resource: "api",
							Defaults: []bucket.Limit{w.limit}, Hits: 1})
						time.Sleep(10 * time.Millisecond)
					}
				})
			}
		}
	}
	wg.Wait()
}

// startSync starts another sync in r.
func (w *world) startSync(r *region) {
	ctx, cancel := context.WithCancel(context.Background())
	rs := &runningSync{cancel: cancel, done: make(chan struct{})}
	s := r.newSync()
	go func() {
		defer close(rs.done)
		s.Run(ctx, func(round syncer.Round) {
			rs.rounds.Add(1)
			rs.wrote.Add(int64(round.Wrote))
			if n := len(round.Unread) + len(round.Refused) + len(round.Failed); n > 0 {
				rs.errs.Add(int64(n))
				w.t.Logf("%s's sync, slot %d: unread %v, refused %v, failed %v", r.name, round.Slot, round.Unread, round.Refused, round.Failed)
			}
		})
	}()
	r.syncs = append(r.syncs, rs)
	w.t.Cleanup(func() { cancel(); <-rs.done })
}

// killSync stops r's first running sync, mid-round or not.
func (w *world) killSync(r *region) {
	for _, s := range r.syncs {
		select {
		case <-s.done:
			continue
		default:
		}
		s.cancel()
		<-s.done
		return
	}
}

// load asks each region's replicas for its demand, a request every
// 1/demand seconds spread over 64 workers a region (as many as keep up
// while calls wait out their deadlines), until ctx ends.
func (w *world) load(ctx context.Context) *sync.WaitGroup {
	var wg sync.WaitGroup
	for _, r := range w.region {
		work := make(chan int, 4096)
		for i := range 64 {
			wg.Go(func() {
				b := r.replicas[i%len(r.replicas)]
				for range work {
					// Counted by when the decision began, not when it
					// was asked for: a request the workers are late
					// for is decided late.
					began := time.Now()
					n := min(int(began.Sub(w.start)/tick), len(r.admitted)-1)
					dctx, cancel := context.WithTimeout(ctx, w.deadline)
					d, err := b.Decide(dctx, &backend.Request{Entity: w.key.Entity, Resource: w.key.Resource,
						Defaults: []bucket.Limit{w.limit}, Hits: 1, Global: true})
					cancel()
					took := time.Since(began)
					o := wasDenied
					switch {
					case err != nil && ctx.Err() == nil:
						o = wasFailed
					case err == nil && d.Allowed:
						o = wasAdmitted
					}
					r.lat.add(n, took, o)
					if took >= 50*time.Millisecond {
						r.slow.Add(1)
					}
					r.asked[n].Add(1)
					switch {
					case err != nil && ctx.Err() == nil:
						r.errs.Add(1)
						r.failed[n].Add(1)
						r.firstErr.CompareAndSwap(nil, err.Error())
						kind := quoted.ReplaceAllString(err.Error(), "…")
						r.kindsMu.Lock()
						r.kinds[kind]++
						r.kindsMu.Unlock()
					case err == nil && d.Allowed:
						r.admitted[n].Add(1)
					}
				}
			})
		}
		wg.Go(func() {
			defer close(work)
			var owed float64
			t := time.NewTicker(10 * time.Millisecond)
			defer t.Stop()
			last := time.Now()
			for {
				select {
				case <-ctx.Done():
					return
				case now := <-t.C:
					owed += float64(r.demand.Load()) * now.Sub(last).Seconds()
					last = now
					n := int(now.Sub(w.start) / tick)
					for ; owed >= 1 && n < len(r.admitted); owed-- {
						select {
						case work <- n:
						default: // the workers are behind: the request is not made
						}
					}
				}
			}
		})
	}
	return &wg
}

// setDemand sets each region's rate, as parts of total (requests a
// second) in the order of names.
func (w *world) setDemand(total float64, parts map[regions.Region]float64) {
	for name, p := range parts {
		w.region[name].demand.Store(int64(math.Round(total * p)))
	}
}

// sum is what regions admitted in ticks [from, to).
func (w *world) sum(from, to int, counts func(*region) []atomic.Int64, names ...regions.Region) int64 {
	if len(names) == 0 {
		names = w.names
	}
	var n int64
	for _, name := range names {
		c := counts(w.region[name])
		for i := max(from, 0); i < min(to, len(c)); i++ {
			n += c[i].Load()
		}
	}
	return n
}

func admitted(r *region) []atomic.Int64 { return r.admitted }
func asked(r *region) []atomic.Int64    { return r.asked }
func failed(r *region) []atomic.Int64   { return r.failed }

// TestRegionsKeepTheBoundAndFollowDemand runs a world of three regions
// with demand at 1.5 times the limit, split 80/15/5 and then 5/15/80,
// with a second sync started in one region. It holds the issue's
// targets at full size with -regions.long (make soak: 10 s windows,
// 1,000/s, a 60 s partition of one region and a 60 s outage of another's
// syncs), and a smaller form in make test (8 s windows, 50/s, no
// partition nor outage, a window more to settle; see worldConfig):
//   - the bound: in any span of a window, the regions together admit no
//     more than the burst and the rate over the span allow, plus what
//     leases held when it began and the requests a deadline may
//     straddle, and over the whole run no more than B + R*T + 3;
//   - use: in each window while demand exceeds the limit, outside the
//     warm-up, the shift and faults and the windows they take to
//     settle, at least minUse of the rate is admitted;
//   - following demand: once settled after the shift, the new heavy
//     region admits at least 0.8 of the part of the limit its demand
//     calls for (0.8 of it, demand being split 5/15/80);
//   - no decision leaves its region: the replicas have no client of
//     another region's table. Each call has its deadline (Envoy's 50 ms
//     at full size); the p50 and p99 of the decisions are logged, and
//     at most maxFailed of them may fail.
func TestRegionsKeepTheBoundAndFollowDemand(t *testing.T) {
	c := worldConfig{clock: regions.Clock{Window: 8_000, Skew: 200, Hold: 300}, rate: "50/s", near: 5 * time.Millisecond, far: 70 * time.Millisecond,
		shift: 6, end: 12, minUse: 0.85, settle: 4, deadline: time.Second, maxFailed: 0.02}
	if *long {
		c = worldConfig{clock: regions.Clock{Window: 10_000, Skew: 1_000, Hold: 1_000}, rate: "1000/s", near: 5 * time.Millisecond, far: 70 * time.Millisecond,
			shift: 12, partition: 18, kill: 30, end: 48, minUse: 0.9, settle: 3, deadline: 50 * time.Millisecond, maxFailed: 0.001, coldFailed: 0.03}
	}
	c.baseline = *baseline
	w := newWorld(t, c)
	win := int(time.Duration(c.clock.Window) * time.Millisecond / tick) // ticks a window
	if !c.baseline {
		for _, name := range w.names {
			w.startSync(w.region[name])
		}
		w.startSync(w.region["eu-west-1"]) // started twice
	}
	heavyFirst := map[regions.Region]float64{"us-east-1": 0.80, "eu-west-1": 0.15, "ap-south-1": 0.05}
	heavyLast := map[regions.Region]float64{"us-east-1": 0.05, "eu-west-1": 0.15, "ap-south-1": 0.80}
	total := 1.5 * w.rate
	w.setDemand(total, heavyFirst)
	// Start at a window's beginning on the world's clock, so that the
	// windows measured below are the regions' slots, give or take skew.
	time.Sleep(time.Until(time.UnixMilli(c.clock.Start(c.clock.At(time.Now().UnixMilli()) + 1))))
	w.start = time.Now()
	ctx, stop := context.WithCancel(context.Background())
	wg := w.load(ctx)
	at := func(ticks int) { time.Sleep(time.Until(w.start.Add(time.Duration(ticks) * tick))) }

	minute := int(time.Minute / tick)
	shift, end := c.shift*win, c.end*win
	// Use is not asserted over the warm-up, the 3 windows after the
	// shift, nor from a fault's start to 3 windows after its end.
	settle := c.settle * win
	excluded := [][2]int{{0, settle}, {shift, shift + settle}}
	type event struct {
		at int
		do func()
	}
	events := []event{{shift, func() { w.setDemand(total, heavyLast) }}}
	if c.partition > 0 {
		cut := func(heal bool) {
			for _, other := range w.names {
				if other == "ap-south-1" {
					continue
				}
				for _, p := range []*dynamodbtest.Proxy{w.region["ap-south-1"].far[other], w.region[other].far["ap-south-1"]} {
					if heal {
						p.Heal()
					} else {
						p.Partition()
					}
				}
			}
		}
		at := c.partition * win
		events = append(events, event{at, func() { cut(false) }}, event{at + minute, func() { cut(true) }})
		excluded = append(excluded, [2]int{at, at + minute + settle})
	}
	if c.kill > 0 && !c.baseline {
		at := c.kill * win
		events = append(events, event{at, func() { w.killSync(w.region["us-east-1"]) }},
			event{at + minute, func() { w.startSync(w.region["us-east-1"]) }})
		excluded = append(excluded, [2]int{at, at + minute + settle})
	}
	slices.SortFunc(events, func(a, b event) int { return a.at - b.at })
	for _, e := range events {
		at(e.at)
		e.do()
	}
	at(end)
	stop()
	wg.Wait()

	// The bound over every span of a window, and over the whole run.
	burst := float64(w.limit.Burst) / bucket.Milli
	slack := w.rate*c.deadline.Seconds() + 3 // a decision may take up to its deadline
	// Over a span that starts while leases are out, the tokens they hold
	// (at most lease.DefaultShare of each region's burst, a tenth of the
	// limit's together) may be spent on top: they left their buckets
	// before it (docs/dynamodb.md). Over the whole run, from full buckets
	// and no leases, the bound is exact.
	var tightest float64
	for from := 0; from+win <= end; from++ {
		got := w.sum(from, from+win, admitted)
		allowed := burst*(1+lease.DefaultShare) + w.rate*float64(win)*tick.Seconds()
		tightest = max(tightest, float64(got)/allowed)
		if float64(got) > allowed+slack {
			t.Errorf("ticks %d to %d: %d admitted, over the %.0f the limit allows", from, from+win, got, allowed+slack)
		}
	}
	t.Logf("the fullest window admitted %.3f of 1.1*B + R*W", tightest)
	all := w.sum(0, end, admitted)
	run := time.Duration(end)*tick + c.deadline // the last decisions end within their deadline
	if allowed := burst + w.rate*run.Seconds() + 3; float64(all) > allowed {
		t.Errorf("the run: %d admitted, over B + R*T + 3 = %.0f", all, allowed)
	}
	// Use, window by window.
	inExcluded := func(from int) bool {
		for _, e := range excluded {
			if from < e[1] && from+win > e[0] {
				return true
			}
		}
		return false
	}
	for from := 0; from+win <= end; from += win {
		got := w.sum(from, from+win, admitted)
		use := float64(got) / (w.rate * float64(win) * tick.Seconds())
		heavy := regions.Region("us-east-1")
		if from >= shift {
			heavy = "ap-south-1"
		}
		h := float64(w.sum(from, from+win, admitted, heavy)) / (0.8 * w.rate * float64(win) * tick.Seconds())
		t.Logf("window at %5.1fs: admitted %.2f of the rate, asked %.2f; %s %.2f of its part; failed %d", (time.Duration(from) * tick).Seconds(),
			use, float64(w.sum(from, from+win, asked))/(w.rate*float64(win)*tick.Seconds()), heavy, h, w.sum(from, from+win, failed))
		if inExcluded(from) || c.baseline {
			continue
		}
		if use < c.minUse {
			t.Errorf("window at %v: %.2f of the rate admitted, want %.2f while demand exceeds it", time.Duration(from)*tick, use, c.minUse)
		}
		if from >= shift+settle && h < 0.8 {
			t.Errorf("window at %v: the heavy region %s admitted %.2f of its part, want 0.8", time.Duration(from)*tick, heavy, h)
		}
	}
	for _, name := range w.names {
		r := w.region[name]
		var rounds, wrote, errs int64
		for _, s := range r.syncs {
			rounds, wrote, errs = rounds+s.rounds.Load(), wrote+s.wrote.Load(), errs+s.errs.Load()
		}
		t.Logf("%s: p50 %v, p99 %v, %d decisions of 50 ms or more, %d failed; its syncs: %d rounds, %d writes (%.2f a window), %d errors",
			name, r.lat.quantile(0.5), r.lat.quantile(0.99), r.slow.Load(), r.errs.Load(), rounds, wrote, float64(wrote)/float64(c.end), errs)
		if len(r.kinds) > 0 {
			t.Logf("%s: failed decisions by kind: %v", name, r.kinds)
		}
		for i, b := range r.replicas {
			st := b.Stats()
			calls, errs := st.Calls()
			t.Logf("%s replica %d: %d answered from memory, %d deadline denials, %d lost races, %d contended denials, calls %v, errors %v",
				name, i, st.LocalAnswers.Load(), st.DeadlineDenials.Load(), st.ConditionRetries.Load(), st.Contended.Load(), calls, errs)
		}
		// A call that fails is one Envoy answers by its failure mode;
		// past maxFailed of the calls, that is a fault of its own. The
		// first window is the cold start of everything at once (the
		// emulator's JVM, six replicas and four syncs on two cores, each
		// replica's first reads of the key's records and share): it is
		// held to coldFailed of its calls where that is set, and the rest of the run to
		// maxFailed of the rest.
		coldN, coldAsked := w.sum(0, win, failed, name), w.sum(0, win, asked, name)
		restN, restAsked := w.sum(win, end+1, failed, name), w.sum(win, end+1, asked, name)
		t.Logf("%s: %d of %d decisions failed in the first window, %d of %d after it", name, coldN, coldAsked, restN, restAsked)
		if c.coldFailed == 0 {
			restN, restAsked = restN+coldN, restAsked+coldAsked
		} else if float64(coldN) > c.coldFailed*float64(coldAsked) {
			t.Errorf("%s: %d of %d decisions of the first window failed, the first with %v", name, coldN, coldAsked, r.firstErr.Load())
		}
		if float64(restN) > c.maxFailed*float64(restAsked) {
			t.Errorf("%s: %d of %d decisions failed (the first window's counted apart: %v), the first with %v", name, restN, restAsked, c.coldFailed > 0, r.firstErr.Load())
		}

	}
	t.Logf("admitted %d over %v: %.3f of B + R*T", all, run, float64(all)/(burst+w.rate*run.Seconds()))
}

// abQueries sends its queries through its AdminAPI while gated says so,
// and straight to open otherwise: the same world with and without the
// syncs' gates, window by window.
type abQueries struct {
	ddb.AdminAPI
	open  *dynamodb.Client
	gated func() bool
}

func (a abQueries) Query(ctx context.Context, in *dynamodb.QueryInput, opts ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	if a.gated() {
		return a.AdminAPI.Query(ctx, in, opts...)
	}
	return a.open.Query(ctx, in, opts...)
}
