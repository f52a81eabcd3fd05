package redis

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/backendtest"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
)

// A lease call reports on its lease first (what it gives back comes back
// only from a window that still counts it out), is decided, and then
// takes its grant in whole tokens from what is left, all counted in the
// consumed total when they leave the bucket, and out on lease in the new
// window with what the lease kept; a denied call takes no grant, what
// comes back never lifts the bucket above its burst less what is out,
// and a report on a window already freed gives nothing back.
func TestScriptLeaseCall(t *testing.T) {
	srv := redistest.Require(t)
	rc := newClient(t, srv)
	l := bucket.Limit{Name: "x", Amount: 10 * bucket.Milli, Period: 1000, Burst: 10 * bucket.Milli}
	b := scriptBucket{key: "{lease}:a", cfg: bucket.Fingerprint([]bucket.Limit{l}), limits: []bucket.Limit{l}}
	const now = int64(1_700_000_000_000)
	w := now/bucket.ExpiryMargin + 5 // a window that has not ended
	type report struct{ back, out, keep, win, newWin int64 }
	for i, c := range []struct {
		cost, want                                int64
		rep                                       report
		allowed                                   bool
		tokens, granted, consumed, cut, kept, out int64
	}{
		{cost: 1000, want: 5000, rep: report{newWin: w}, allowed: true, tokens: 4000, granted: 5000, consumed: 6000, out: 5000},
		// 4 + 5 back = 9, less 1 = 8: all 8 granted of the 100 asked.
		{cost: 1000, want: 100_000, rep: report{back: 5000, out: 5000, win: w, newWin: w}, allowed: true, tokens: 0, granted: 8000, consumed: 15_000, out: 8000},
		{cost: 1000, want: 5000, rep: report{newWin: w}, allowed: false, tokens: 0, granted: 0, consumed: 15_000, out: 8000},
		// 20 back of a lease of 8: only the 8 it had out come back; then
		// half a token less grants only whole tokens.
		{cost: 500, want: 100_000, rep: report{back: 20_000, out: 8000, win: w, newWin: w + 1}, allowed: true, tokens: 500, granted: 7000, consumed: 22_500, out: 7000},
		// A report on a window the bucket does not count: nothing back.
		{cost: 0, want: 0, rep: report{back: 3000, out: 3000, win: w - 3, newWin: w + 1}, allowed: true, tokens: 500, consumed: 22_500, cut: 3000, out: 7000},
		// A renewal keeps its 7 out, in the next window.
		{cost: 0, want: 0, rep: report{out: 7000, keep: 7000, win: w + 1, newWin: w + 2}, allowed: true, tokens: 500, consumed: 22_500, kept: 7000, out: 7000},
	} {
		r := runScript(t, rc, now, []scriptGroup{{buckets: []scriptBucket{b}, calls: []scriptCall{{lease: true,
			costs: []int64{c.cost}, back: []int64{c.rep.back}, want: []int64{c.want}, out: []int64{c.rep.out},
			keep: []int64{c.rep.keep}, win: []int64{c.rep.win}, newWin: []int64{c.rep.newWin}}}}})
		if r[0].err != nil {
			t.Fatal(r[0].err)
		}
		g := r[0]
		allowed, after := g.allowed[0], g.after[0][0]
		if allowed != c.allowed || after.Tokens != c.tokens || g.granted[0][0] != c.granted || after.Consumed != c.consumed ||
			g.cut[0][0] != c.cut || g.kept[0][0] != c.kept || after.Leased() != c.out {
			t.Errorf("call %d: allowed %v, tokens %d, granted %d, consumed %d, cut %d, kept %d, out %d; want %v, %d, %d, %d, %d, %d, %d",
				i, allowed, after.Tokens, g.granted[0][0], after.Consumed, g.cut[0][0], g.kept[0][0], after.Leased(),
				c.allowed, c.tokens, c.granted, c.consumed, c.cut, c.kept, c.out)
		}
	}
	if got := consumedOf(t, srv, b.key, l); got != 22_500 {
		t.Errorf("the bucket's consumed total is %d, want 22500", got)
	}
	// Once the windows have ended and the margin passed, what they held
	// is no longer out: refill may fill the burst again, from then on
	// (the room they leave is not refilled from the clock's past). A
	// report in the run that frees its window still gives back what the
	// lease held when it expired; one after it gives nothing.
	later := (w+2)*bucket.ExpiryMargin + bucket.ExpiryMargin + 1
	for i, c := range []struct {
		at, cost, back, tokens int64
	}{
		{at: later, back: 7000, tokens: 10_000},  // 3 refilled, 7 given back
		{at: later + 1, cost: 10_000, tokens: 0}, // full: nothing more refilled
		{at: later + 2, back: 7000, tokens: 10},  // freed: only the refill
	} {
		r := runScript(t, rc, c.at, []scriptGroup{{buckets: []scriptBucket{b}, calls: []scriptCall{{lease: true,
			costs: []int64{c.cost}, back: []int64{c.back}, want: []int64{0}, out: []int64{c.back}, keep: []int64{0},
			win: []int64{w + 2}, newWin: []int64{w + 10}}}}})
		if got := r[0].after[0][0]; !r[0].allowed[0] || got.Leased() != 0 || got.Tokens != c.tokens {
			t.Errorf("call %d, %d ms after the windows ended and the margin passed: allowed %v, %d out, %d tokens; want 0 out and %d",
				i, c.at-later+1, r[0].allowed[0], got.Leased(), got.Tokens, c.tokens)
		}
	}
}

func consumedOf(t *testing.T, srv *redistest.Server, key string, l bucket.Limit) int64 {
	t.Helper()
	return consumed(t, srv, key, []bucket.Limit{l})[0]
}

// tokensOf reads limit l's tokens of the bucket at key as stored.
func tokensOf(t *testing.T, srv *redistest.Server, key string, l bucket.Limit) int64 {
	t.Helper()
	v, err := srv.Do(context.Background(), "HGET", key, "b_"+l.Name+"_tk")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("%s tokens %q: %v", key, v, err)
	}
	return n
}

// With leases, one replica answers most decisions from memory, each with
// the remaining count one bucket would give, and Close gives the lease
// back: the bucket then holds exactly what was not admitted.
func TestLeasesAnswerFromMemory(t *testing.T) {
	srv := redistest.Require(t)
	clk := newFakeClock()
	rb := newBackend(t, newClient(t, srv), Options{Now: clk.now, LeaseHorizon: 30 * time.Second})
	l := specLimits(t, []bucket.Spec{{Name: "x", Rate: "1/h", Burst: ptr(int64(1000))}})[0]
	req := backend.Request{Entity: "e", Resource: "r", Defaults: []bucket.Limit{l}, Hits: 1}
	const n = 300
	for i := 1; i <= n; i++ {
		clk.advance(10)
		r := req
		d, err := rb.Decide(context.Background(), &r)
		if err != nil || !d.Allowed {
			t.Fatalf("decision %d: %+v, %v", i, d, err)
		}
		if got, want := d.Results[0].Tokens, int64(1000-i)*bucket.Milli; got != want {
			t.Fatalf("decision %d: %d millitokens remaining, want %d", i, got, want)
		}
		waitLeases(t, rb)
	}
	s := rb.Stats()
	t.Logf("%d decisions: %d scripts, %d answered locally, %d leased", n, s.Scripts.Load(), s.LocalAnswers.Load(), s.Leased.Load())
	if s.Scripts.Load() > n/10 {
		t.Errorf("%d runs of the script for %d decisions, want at most %d", s.Scripts.Load(), n, n/10)
	}
	if err := rb.Close(); err != nil {
		t.Fatal(err)
	}
	if tk := tokensOf(t, srv, rb.keys.Bucket("e", "r", ""), l); tk != (1000-n)*bucket.Milli {
		t.Errorf("after Close the bucket holds %d millitokens, want %d", tk, (1000-n)*bucket.Milli)
	}
	if s.LeaseOutstanding.Load() != 0 || s.Returned.Load() == 0 {
		t.Errorf("after Close: %d outstanding, %d returned", s.LeaseOutstanding.Load(), s.Returned.Load())
	}
}

func ptr[T any](v T) *T { return &v }

// A call its lease cannot pay, made while a renewal of that lease is on
// its way, answers with what the lease holds once both have landed, as a
// call the lease pays does: Redis may run the renewal first (the two
// often share a run), and its grant is then in the lease, no longer in
// the bucket the call's run reports. Such an answer once left the grant
// out: one replica on 20 a minute answered 13 after 5 calls, not 15. With
// Redis 5 ms away and the clock still, the lease runs dry while each
// renewal is on its way, and every answer must be one bucket's.
func TestLeaseCallAnswersWithTheLease(t *testing.T) {
	srv := redistest.Require(t)
	clk := newFakeClock()
	rb := newBackend(t, newClient(t, srv), Options{Now: clk.now, LeaseHorizon: 30 * time.Second, Call: farCall(5 * time.Millisecond)})
	l := specLimits(t, []bucket.Spec{{Name: "x", Rate: "20/min"}})[0]
	req := backend.Request{Entity: "e", Resource: "r", Defaults: []bucket.Limit{l}, Hits: 1}
	const n = 15
	for i := int64(1); i <= n; i++ {
		r := req
		d, err := rb.Decide(context.Background(), &r)
		if err != nil || !d.Allowed {
			t.Fatalf("decision %d: %+v, %v", i, d, err)
		}
		if got, want := d.Results[0].Tokens, (20-i)*bucket.Milli; got != want {
			t.Errorf("decision %d: %d millitokens remaining, want %d", i, got, want)
		}
		if got, want := d.Results[0].Wait, i*3000; got != want {
			t.Errorf("decision %d: full again in %d ms, want %d", i, got, want)
		}
	}
	s := rb.Stats()
	t.Logf("%d decisions: %d scripts (%d coalesced), %d answered locally", n, s.Scripts.Load(), s.Coalesced.Load(), s.LocalAnswers.Load())
	if err := rb.Close(); err != nil {
		t.Fatal(err)
	}
	if tk := tokensOf(t, srv, rb.keys.Bucket("e", "r", ""), l); tk != (20-n)*bucket.Milli {
		t.Errorf("after Close the bucket holds %d millitokens, want %d", tk, (20-n)*bucket.Milli)
	}
}

// waitLeases waits until no renewal or return of b runs.
func waitLeases(t *testing.T, b *Backend) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); b.leases.Busy(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a renewal or return is still running after 10 s")
		}
	}
}

// farCall delays every round trip to Redis by d: Redis in another region.
func farCall(d time.Duration) func(ctx context.Context, op string, fn func(context.Context) error) error {
	return func(ctx context.Context, op string, fn func(context.Context) error) error {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return ctx.Err()
		}
		return fn(ctx)
	}
}

// Three replicas sharing one Redis 70 ms away, one key at its limit, 30
// callers each whose calls have 40 ms (Envoy's 50 less the service's
// margin), after one unhurried call per replica: the fleet admits most of
// its bound and never more, and every call is answered in time, admitted
// or denied, none left to Envoy's failure mode. Without leases every
// call here failed.
func TestFarRedisAtTheLimit(t *testing.T) {
	srv := redistest.Require(t)
	l := specLimits(t, []bucket.Spec{{Name: "x", Rate: "500/s", Burst: ptr(int64(500))}})[0]
	req := backend.Request{Entity: "far", Resource: "r", Defaults: []bucket.Limit{l}, Hits: 1}
	var replicas []*Backend
	for range 3 {
		replicas = append(replicas, newBackend(t, newClient(t, srv), Options{LeaseHorizon: 30 * time.Second, Call: farCall(70 * time.Millisecond)}))
	}
	start := time.Now()
	for _, b := range replicas {
		r := req
		if d, err := b.Decide(context.Background(), &r); err != nil || !d.Allowed {
			t.Fatalf("unhurried first call: %+v, %v", d, err)
		}
	}
	loadStart := time.Now()
	ds := make([]backendtest.Decider, len(replicas))
	for i, b := range replicas {
		ds[i] = b
	}
	res := backendtest.Storm(ds, req, 30, 2*time.Second, 40*time.Millisecond, 50*time.Millisecond)
	elapsed := time.Since(start)
	bound := float64(l.Burst)/bucket.Milli + 500*elapsed.Seconds() + 1
	got := float64(res.Admitted + 3)
	reachable := float64(l.Burst)/bucket.Milli + 500*time.Since(loadStart).Seconds() + 3
	t.Logf("%v (+3 unhurried); bound %.0f over %v: %.3f of it, %.3f of the burst and the load's own refill",
		res, bound, elapsed.Round(time.Millisecond), got/bound, got/reachable)
	res.AtTheLimit(t, got, bound, reachable)
	// Every token the bucket's consumed total counts was admitted, given
	// back by a lease, cut by the burst on its way back, or dropped by a
	// run whose outcome its replica could not know: after Close, to the
	// millitoken.
	var back, cut, dropped int64
	for _, b := range replicas {
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		s := b.Stats()
		back, cut, dropped = back+int64(s.Returned.Load()), cut+int64(s.LeaseCut.Load()), dropped+int64(s.LeaseDropped.Load())
	}
	tc := consumedOf(t, srv, replicas[0].keys.Bucket("far", "r", ""), l)
	if want := int64(got)*bucket.Milli + back + cut + dropped; tc != want {
		t.Errorf("consumed %d millitokens, but admitted %.0f tokens + returned %d + cut %d + dropped %d = %d", tc, got, back, cut, dropped, want)
	}
}

// A lease call whose caller gave up still lands: the grant it took is in
// the lease for the next call.
func TestAbandonedLeaseCallWarmsTheKey(t *testing.T) {
	srv := redistest.Require(t)
	rb := newBackend(t, newClient(t, srv), Options{LeaseHorizon: 30 * time.Second, Call: farCall(150 * time.Millisecond)})
	l := specLimits(t, []bucket.Spec{{Name: "x", Rate: "1/h", Burst: ptr(int64(1000))}})[0]
	req := backend.Request{Entity: "cold", Resource: "r", Defaults: []bucket.Limit{l}, Hits: 1}
	// The key's config records are read (and cached) unhurried: this is
	// about the bucket's run.
	if _, err := rb.records.get(context.Background(), "cold", "r"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	r := req
	_, err := rb.Decide(ctx, &r)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a 50 ms call on Redis 150 ms away: %v, want a deadline", err)
	}
	for deadline := time.Now().Add(5 * time.Second); rb.Stats().LeaseOutstanding.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			s := rb.Stats()
			t.Fatalf("the abandoned call's run never filled the lease: %d scripts, %d errors, %d leased, %d dropped", s.Scripts.Load(), s.ScriptErrors.Load(), s.Leased.Load(), s.LeaseDropped.Load())
		}
	}
	r = req
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if d, err := rb.Decide(ctx, &r); err != nil || !d.Allowed {
		t.Fatalf("the call after: %+v, %v; want admitted from the lease", d, err)
	}
	if err := rb.Close(); err != nil {
		t.Fatal(err)
	}
	// One call admitted, and the abandoned one's token spent by nobody:
	// it left the bucket as spent, not as a lease, and a lease that spent
	// it later could spend it on top of a bucket refilled meanwhile. The
	// grant its run took came back with the lease.
	if tk := tokensOf(t, srv, rb.keys.Bucket("cold", "r", ""), l); tk < 998*bucket.Milli || tk > 998*bucket.Milli+10 {
		t.Errorf("after Close the bucket holds %d millitokens, want 998000 (one admitted, one lost with its caller)", tk)
	}
}

// Denials stay local: once a replica has seen its bucket unable to pay,
// a flood over the limit costs no runs of the script, and is denied
// exactly as one bucket would deny it.
func TestLeasedDenialsStayLocal(t *testing.T) {
	srv := redistest.Require(t)
	clk := newFakeClock()
	rb := newBackend(t, newClient(t, srv), Options{Now: clk.now, LeaseHorizon: 30 * time.Second})
	l := specLimits(t, []bucket.Spec{{Name: "x", Rate: "1/h", Burst: ptr(int64(10))}})[0]
	req := backend.Request{Entity: "e", Resource: "r", Defaults: []bucket.Limit{l}, Hits: 1}
	admitted := 0
	for range 10 {
		r := req
		d, err := rb.Decide(context.Background(), &r)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
		waitLeases(t, rb)
	}
	if admitted != 10 {
		t.Fatalf("%d of the burst of 10 admitted", admitted)
	}
	scripts := rb.Stats().Scripts.Load()
	for i := range 100 {
		clk.advance(1)
		r := req
		d, err := rb.Decide(context.Background(), &r)
		if err != nil || d.Allowed {
			t.Fatalf("call %d over the limit: %+v, %v", i, d, err)
		}
		if d.Results[0].Wait <= 0 {
			t.Fatalf("call %d denied with wait %d", i, d.Results[0].Wait)
		}
	}
	if n := rb.Stats().Scripts.Load() - scripts; n > 1 {
		t.Errorf("100 denials ran the script %d times, want at most 1 (the first, to see the bucket)", n)
	}
}

// Calls that miss a lease together ask for one grant between them: a
// replica's leases stay within the policy's share of the burst however
// many of its callers find a key cold at once.
func TestColdCallsShareOneGrant(t *testing.T) {
	srv := redistest.Require(t)
	rb := newBackend(t, newClient(t, srv), Options{LeaseHorizon: 30 * time.Second, Call: farCall(20 * time.Millisecond)})
	l := specLimits(t, []bucket.Spec{{Name: "x", Rate: "1/h", Burst: ptr(int64(100_000))}})[0]
	req := backend.Request{Entity: "cold", Resource: "r", Defaults: []bucket.Limit{l}, Hits: 1}
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			r := req
			if d, err := rb.Decide(context.Background(), &r); err != nil || !d.Allowed {
				t.Errorf("a cold call: %+v, %v", d, err)
			}
		})
	}
	wg.Wait()
	waitLeases(t, rb)
	// The policy's cap: a tenth of the burst for the whole fleet.
	if held, most := rb.Stats().LeaseOutstanding.Load(), l.Burst/10; held > most {
		t.Errorf("64 cold calls left %d millitokens leased, over the share of the burst (%d)", held, most)
	}
}

// Takes marked Bulk (an Envoy's quota assignment, paced by the Envoy)
// run the script every time, even with leases on: none is paid from a
// lease or counted as the demand leases are sized by, so they leave no
// tokens idle in a lease, and Redis holds exactly what they left.
func TestBulkTakesBypassLeases(t *testing.T) {
	srv := redistest.Require(t)
	clk := newFakeClock()
	rb := newBackend(t, newClient(t, srv), Options{Now: clk.now, LeaseHorizon: 30 * time.Second})
	l := specLimits(t, []bucket.Spec{{Name: "x", Rate: "1/h", Burst: ptr(int64(1000))}})[0]
	req := backend.Request{Entity: "e", Resource: "r", Defaults: []bucket.Limit{l}, Hits: 20, Bulk: true}
	key := rb.keys.Bucket("e", "r", "")
	const n = 30
	for i := 1; i <= n; i++ {
		clk.advance(100)
		r := req
		d, err := rb.Decide(context.Background(), &r)
		if err != nil || !d.Allowed {
			t.Fatalf("take %d: %+v, %v", i, d, err)
		}
		waitLeases(t, rb)
		if tk := tokensOf(t, srv, key, l); tk != int64(1000-20*i)*bucket.Milli {
			t.Fatalf("after take %d Redis holds %d millitokens, want %d", i, tk, int64(1000-20*i)*bucket.Milli)
		}
	}
	s := rb.Stats()
	if s.Scripts.Load() != n {
		t.Errorf("%d runs of the script for %d bulk takes, want one each", s.Scripts.Load(), n)
	}
	if s.LocalAnswers.Load() != 0 || s.Leased.Load() != 0 || s.LeaseOutstanding.Load() != 0 {
		t.Errorf("bulk takes went through the leases: %d answered locally, %d leased, %d outstanding",
			s.LocalAnswers.Load(), s.Leased.Load(), s.LeaseOutstanding.Load())
	}
	big := req
	big.Hits = 500
	d, err := rb.Decide(context.Background(), &big)
	if err != nil || d.Allowed || d.Results[0].Tokens != 400*bucket.Milli {
		t.Errorf("a take of 500 from 400: %+v, %v; want denied with 400000 millitokens left", d, err)
	}
}
