package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/bucket/period"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
)

// runScript runs decideLua for groups on a real server.
func runScript(t *testing.T, c rueidis.Client, now int64, groups []scriptGroup) []groupReply {
	t.Helper()
	keys, argv := scriptArgs(now, bucket.ExpiryMargin, groups)
	reply, err := rueidis.NewLuaScript(decideLua).Exec(context.Background(), c, keys, argv).ToArray()
	if err != nil {
		t.Fatalf("script: %v", err)
	}
	r, err := parseReply(groups, reply)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// consumed is what the bucket at key has recorded as consumed by each of
// limits.
func consumed(t *testing.T, srv *redistest.Server, key string, limits []bucket.Limit) []int64 {
	t.Helper()
	out := make([]int64, len(limits))
	for i, l := range limits {
		v, err := srv.Do(context.Background(), "HGET", key, "b_"+l.Name+"_tc")
		if err != nil { // a missing field reads as ""
			t.Fatal(err)
		}
		if v != "" {
			if out[i], err = strconv.ParseInt(v, 10, 64); err != nil {
				t.Fatalf("%s consumed %q: %v", key, v, err)
			}
		}
	}
	return out
}

func newClient(t *testing.T, srv *redistest.Server) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// modelBucket is what backend/bucket says a bucket holds: the limits and
// states last written, as the memory backend keeps them.
type modelBucket struct {
	limits []bucket.Limit
	states []bucket.State
}

// randomLimits are one to three limits with rates and bursts from the
// whole range Sluice accepts, the extremes included, and budgets for
// calendar periods in zones with and without daylight saving.
func randomLimits(r *rand.Rand) []bucket.Limit {
	periods := []int64{1000, 60_000, 3_600_000, 86_400_000, 7 * 86_400_000, 10 * 365 * 86_400_000}
	amounts := []int64{0, 1, 3, 7, 10, 1000, 999_983, bucket.MaxTokens}
	n := 1 + r.IntN(3)
	out := make([]bucket.Limit, 0, n)
	for i := range n {
		a := amounts[r.IntN(len(amounts))] * bucket.Milli
		if r.IntN(4) == 0 {
			a = (1 + r.Int64N(100_000)) * bucket.Milli
		}
		burst := a
		if r.IntN(3) == 0 {
			burst = r.Int64N(bucket.MaxTokens) * bucket.Milli
		}
		l := bucket.Limit{Name: []string{"rpm", "tpm", "odd-name.1_tk"}[i], Amount: a,
			Period: periods[r.IntN(len(periods))], Burst: burst, PerRequest: r.IntN(4) == 0}
		switch r.IntN(4) {
		case 0:
			l.Debt = bucket.NoDebt
		case 1:
			l.Debt = (1 + r.Int64N(bucket.MaxTokens)) * bucket.Milli
		}
		if r.IntN(4) == 0 {
			// A budget, whose period bounds the Go side passes.
			l.Calendar = []period.Unit{period.Day, period.Week, period.Month, period.Year}[r.IntN(4)]
			zone, err := period.LoadZone([]string{"UTC", "Europe/Berlin", "America/Santiago"}[r.IntN(3)])
			if err != nil {
				panic(err)
			}
			l.Zone, l.Burst, l.Period = zone, l.Amount, bucket.Day
			if l.Debt > l.Burst {
				l.Debt = 0
			}
		}
		out = append(out, l)
	}
	return out
}

// The script decides exactly as backend/bucket does: for random limits
// over their whole range, random times from the same millisecond to
// years apart, random hits, refunds, charges (into debt, down to random
// floors), and limits that change under a bucket (raised, lowered,
// added, removed), every decision and every state it leaves (tokens,
// clock, consumed) equal Go's, and so does what the script writes:
// nothing on a denial or a check, and the TTL. A charge's results, read
// back from the states it left, are Go's too.
func TestScriptDecidesAsBucket(t *testing.T) {
	srv := redistest.Require(t)
	c := newClient(t, srv)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(7, 11))
	for run := range 200 {
		key := "diff:" + strconv.Itoa(run)
		var stored *modelBucket
		limits := randomLimits(r)
		now := int64(1_700_000_000_000) + r.Int64N(1_000_000)
		for step := range 40 {
			if r.IntN(8) == 0 {
				limits = randomLimits(r)
			}
			switch r.IntN(4) {
			case 0: // the same millisecond
			case 1:
				now += r.Int64N(1000)
			case 2:
				now += r.Int64N(100_000_000)
			case 3:
				now += r.Int64N(20 * 365 * 86_400_000)
			}
			hits := uint64(r.IntN(5))
			if r.IntN(5) == 0 {
				hits = r.Uint64N(uint64(bucket.MaxTokens) * 2)
			}
			refund := r.IntN(6) == 0
			charge := !refund && r.IntN(3) == 0
			req := &backend.Request{Hits: hits, Refund: refund, Charge: charge}

			// Go: the states the bucket is at now, under these limits.
			var states []bucket.State
			switch {
			case stored == nil:
				for _, l := range limits {
					states = append(states, bucket.Full(l, now))
				}
			default:
				states = bucket.Reconcile(stored.limits, slices.Clone(stored.states), limits, now)
			}
			results, allowed := backend.Apply(req, limits, states, now)

			costs := make([]int64, len(limits))
			anyCost := false
			for i, l := range limits {
				if refund {
					costs[i] = bucket.RefundAmount(l, hits)
				} else {
					costs[i] = bucket.Cost(l, hits)
				}
				anyCost = anyCost || costs[i] > 0
			}
			ttl := int64(0)
			if r.IntN(2) == 0 {
				ttl = 1 + r.Int64N(86_400_000)
			}
			sb := scriptBucket{key: key, cfg: fmt.Sprint(limits), limits: limits, ttlMs: ttl}
			r := runScript(t, c, now, []scriptGroup{{buckets: []scriptBucket{sb}, calls: []scriptCall{{refund: refund, charge: charge, costs: costs}}}})[0]
			where := fmt.Sprintf("run %d step %d: limits %v, %d hits, refund %v, charge %v, at %d", run, step, limits, hits, refund, charge, now)
			if r.allowed[0] != allowed {
				t.Fatalf("%s: script allowed %v, bucket %v", where, r.allowed[0], allowed)
			}
			got := make([]bucket.State, len(limits))
			tc := consumed(t, srv, key, limits)
			for i, a := range r.after[0] {
				got[i] = bucket.State{Tokens: a.Tokens, Clock: a.Clock, Consumed: tc[i]}
			}
			// The script keeps no time at the room (State.AtRoomSince):
			// it credits no refill to spent lease tokens (docs/redis.md).
			for i := range states {
				states[i].AtRoomSince = 0
			}
			if !slices.Equal(got, states) {
				t.Fatalf("%s:\n script states %+v\n bucket states %+v\n stored %+v", where, got, states, stored)
			}
			if charge {
				if got := chargedResults(limits, costs, nil, r.after[0], r.held[0], now); !slices.Equal(got, results) {
					t.Fatalf("%s:\n results read back %+v\n bucket results %+v", where, got, results)
				}
			}
			written := refund || ((allowed || charge) && anyCost)
			if written {
				stored = &modelBucket{limits: slices.Clone(limits), states: slices.Clone(states)}
				pttl, err := srv.Do(ctx, "PTTL", key)
				if err != nil {
					t.Fatal(err)
				}
				if n, _ := strconv.ParseInt(pttl, 10, 64); (ttl == 0 && n != -1) || (ttl > 0 && (n <= 0 || n > ttl)) {
					t.Fatalf("%s: PTTL %s after a write with TTL %d ms", where, pttl, ttl)
				}
			}
		}
	}
}

// A run of several groups is decided as backend/bucket decides their
// calls one after the other at one time: the groups in order, each on
// its buckets as the groups before it left them (the same bucket may be
// in several, alone, in a cascade, or under limits changed between
// them), each call all or nothing over every limit of its group's
// buckets, refunds among them; every state after every call, the
// consumed totals, the TTLs and what is written (nothing for a group
// where no call took or gave back a token) are Go's. A group whose key
// holds a string fails alone, and changes nothing.
func TestScriptDecidesGroupsInOrder(t *testing.T) {
	srv := redistest.Require(t)
	c := newClient(t, srv)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(5, 9))
	now := int64(1_700_000_000_000)
	const poisoned = "batch:poisoned"
	if _, err := srv.Do(ctx, "SET", poisoned, "not a hash"); err != nil {
		t.Fatal(err)
	}
	for run := range 150 {
		// A few buckets, each with the limits it was last written under
		// in Go's model (none: it does not exist).
		keys := []string{"batch:" + strconv.Itoa(run) + ":a", "batch:" + strconv.Itoa(run) + ":b", "batch:" + strconv.Itoa(run) + ":c"}
		current := map[string][]bucket.Limit{}
		for _, k := range keys {
			current[k] = randomLimits(r)
		}
		model := map[string]*modelBucket{}
		for round := range 3 {
			now += r.Int64N(5000)
			groups := make([]scriptGroup, 1+r.IntN(5))
			var want [][][]int64 // per group, per call: allowed (1 or 0), then each limit's tokens and clock after it
			failing := make([]bool, len(groups))
			for gi := range groups {
				// A bucket, or a cascade's two; at times with new limits,
				// at times the poisoned key.
				picked := []string{keys[r.IntN(len(keys))]}
				if r.IntN(2) == 0 {
					if other := keys[r.IntN(len(keys))]; other != picked[0] {
						picked = append(picked, other)
					}
				}
				var bs []scriptBucket
				var limits []bucket.Limit
				var states []bucket.State
				for _, k := range picked {
					if r.IntN(6) == 0 {
						current[k] = randomLimits(r)
					}
					ls := current[k]
					bs = append(bs, scriptBucket{key: k, cfg: bucket.Fingerprint(ls), limits: ls, ttlMs: 1 + r.Int64N(600_000)})
					limits = append(limits, ls...)
					if m := model[k]; m != nil {
						states = append(states, bucket.Reconcile(m.limits, slices.Clone(m.states), ls, now)...)
					} else {
						for _, l := range ls {
							states = append(states, bucket.Full(l, now))
						}
					}
				}
				if r.IntN(10) == 0 {
					failing[gi] = true
					bs = append(bs, scriptBucket{key: poisoned, cfg: "x", limits: []bucket.Limit{{Name: "p", Amount: 1000, Period: 1000, Burst: 1000}}, ttlMs: 1000})
					limits = append(limits, bs[len(bs)-1].limits...)
					states = append(states, bucket.Full(bs[len(bs)-1].limits[0], now))
				}
				calls := make([]scriptCall, 1+r.IntN(6))
				var wantCalls [][]int64
				wrote := false
				for i := range calls {
					req := backend.Request{Hits: uint64(r.IntN(4)), Refund: r.IntN(8) == 0}
					if r.IntN(6) == 0 {
						req.Hits = r.Uint64N(uint64(bucket.MaxTokens))
					}
					calls[i] = scriptCall{refund: req.Refund, costs: costs(&req, limits, nil)}
					_, allowed := backend.Apply(&req, limits, states, now)
					wrote = wrote || req.Refund || (allowed && req.Hits > 0)
					after := []int64{b2i(allowed)}
					for _, s := range states {
						after = append(after, s.Tokens, s.Clock)
					}
					wantCalls = append(wantCalls, after)
				}
				groups[gi] = scriptGroup{buckets: bs, calls: calls}
				want = append(want, wantCalls)
				if wrote && !failing[gi] {
					at := 0
					for _, b := range bs {
						model[b.key] = &modelBucket{limits: b.limits, states: slices.Clone(states[at : at+len(b.limits)])}
						at += len(b.limits)
					}
				}
			}
			got := runScript(t, c, now, groups)
			for gi, g := range got {
				where := fmt.Sprintf("run %d round %d group %d of %d: %+v", run, round, gi, len(groups), groups[gi])
				if failing[gi] {
					if g.err == nil || !strings.Contains(g.err.Error(), "WRONGTYPE") {
						t.Fatalf("%s: a group on a string key answered %v", where, g.err)
					}
					continue
				}
				if g.err != nil {
					t.Fatalf("%s: %v", where, g.err)
				}
				for i := range groups[gi].calls {
					x := []int64{b2i(g.allowed[i])}
					for _, s := range g.after[i] {
						x = append(x, s.Tokens, s.Clock)
					}
					if !slices.Equal(x, want[gi][i]) {
						t.Fatalf("%s: call %d: script %v, bucket %v", where, i, x, want[gi][i])
					}
				}
			}
			for _, k := range keys {
				m := model[k]
				exists, err := srv.Do(ctx, "EXISTS", k)
				if err != nil {
					t.Fatal(err)
				}
				if (m != nil) != (exists == "1") {
					t.Fatalf("run %d round %d: bucket %s written %v, but EXISTS says %s", run, round, k, m != nil, exists)
				}
				if m == nil {
					continue
				}
				tc := consumed(t, srv, k, m.limits)
				for i, s := range m.states {
					if tc[i] != s.Consumed {
						t.Fatalf("run %d round %d: %s limit %s consumed %d, bucket %d", run, round, k, m.limits[i].Name, tc[i], s.Consumed)
					}
				}
				if n := pttl(t, srv, k); n <= 0 || n > 600_000 {
					t.Fatalf("run %d round %d: %s PTTL %d", run, round, k, n)
				}
			}
		}
	}
	if v, err := srv.Do(ctx, "GET", poisoned); err != nil || v != "not a hash" {
		t.Fatalf("the poisoned key holds %q (%v)", v, err)
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
