package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
)

// runScript runs decideLua for calls on bs on a real server.
func runScript(t *testing.T, c rueidis.Client, now int64, bs []scriptBucket, calls []scriptCall) scriptReply {
	t.Helper()
	keys, argv := scriptArgs(now, bs, calls)
	reply, err := rueidis.NewLuaScript(decideLua).Exec(context.Background(), c, keys, argv).AsStrSlice()
	if err != nil {
		t.Fatalf("script: %v", err)
	}
	n := 0
	for _, b := range bs {
		n += len(b.limits)
	}
	r, err := parseReply(n, len(calls), reply)
	if err != nil {
		t.Fatal(err)
	}
	return r
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
// whole range Sluice accepts, the extremes included.
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
		out = append(out, bucket.Limit{Name: []string{"rpm", "tpm", "odd-name.1_tk"}[i], Amount: a,
			Period: periods[r.IntN(len(periods))], Burst: burst, PerRequest: r.IntN(4) == 0})
	}
	return out
}

// The script decides exactly as backend/bucket does: for random limits
// over their whole range, random times from the same millisecond to
// years apart, random hits, refunds, and limits that change under a
// bucket (raised, lowered, added, removed), every decision and every
// state it leaves (tokens, clock, consumed) equal Go's, and so does what
// the script writes: nothing on a denial or a check, and the TTL.
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
			req := &backend.Request{Hits: hits, Refund: refund}

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
			_, allowed := backend.Apply(req, limits, states, now)

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
			r := runScript(t, c, now, []scriptBucket{sb}, []scriptCall{{refund: refund, costs: costs}})
			where := fmt.Sprintf("run %d step %d: limits %v, %d hits, refund %v, at %d", run, step, limits, hits, refund, now)
			if r.allowed[0] != allowed {
				t.Fatalf("%s: script allowed %v, bucket %v", where, r.allowed[0], allowed)
			}
			got := make([]bucket.State, len(limits))
			for i, a := range r.after[0] {
				got[i] = bucket.State{Tokens: a.Tokens, Clock: a.Clock, Consumed: r.consumed[i]}
			}
			if !slices.Equal(got, states) {
				t.Fatalf("%s:\n script states %+v\n bucket states %+v\n stored %+v", where, got, states, stored)
			}
			written := refund || (allowed && anyCost)
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

// A batch of calls is decided as backend/bucket decides them one after
// the other at one time: each all or nothing over every limit of both
// buckets of a cascade, against what the calls before it left, refunds
// among them; the states after each call, the consumed totals after the
// batch and what is written (nothing when no call took or gave back a
// token) are Go's.
func TestScriptDecidesABatchInOrder(t *testing.T) {
	srv := redistest.Require(t)
	c := newClient(t, srv)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(5, 9))
	now := int64(1_700_000_000_000)
	for run := range 300 {
		bs := []scriptBucket{{key: "batch:" + strconv.Itoa(run) + ":child", limits: randomLimits(r)}}
		if r.IntN(2) == 0 {
			bs = append(bs, scriptBucket{key: "batch:" + strconv.Itoa(run) + ":parent", limits: randomLimits(r)})
		}
		var limits []bucket.Limit
		for i := range bs {
			bs[i].cfg = fmt.Sprint(bs[i].limits)
			bs[i].ttlMs = 60_000
			limits = append(limits, bs[i].limits...)
		}
		states := make([]bucket.State, len(limits))
		for i, l := range limits {
			states[i] = bucket.Full(l, now)
		}
		for round := range 3 {
			now += r.Int64N(5000)
			calls := make([]scriptCall, 1+r.IntN(10))
			var want [][]int64 // per call: allowed (1 or 0), then each limit's tokens and clock after it
			wrote := false
			for i := range calls {
				req := backend.Request{Hits: uint64(r.IntN(4)), Refund: r.IntN(8) == 0}
				if r.IntN(6) == 0 {
					req.Hits = r.Uint64N(uint64(bucket.MaxTokens))
				}
				calls[i] = scriptCall{refund: req.Refund, costs: costs(&req, limits)}
				_, allowed := backend.Apply(&req, limits, states, now)
				wrote = wrote || req.Refund || (allowed && req.Hits > 0)
				after := []int64{b2i(allowed)}
				for _, s := range states {
					after = append(after, s.Tokens, s.Clock)
				}
				want = append(want, after)
			}
			got := runScript(t, c, now, bs, calls)
			where := fmt.Sprintf("run %d round %d: limits %v, calls %+v", run, round, limits, calls)
			for i := range calls {
				g := []int64{b2i(got.allowed[i])}
				for _, s := range got.after[i] {
					g = append(g, s.Tokens, s.Clock)
				}
				if !slices.Equal(g, want[i]) {
					t.Fatalf("%s: call %d: script %v, bucket %v", where, i, g, want[i])
				}
			}
			for i, s := range states {
				if got.consumed[i] != s.Consumed {
					t.Fatalf("%s: limit %d consumed %d, bucket %d", where, i, got.consumed[i], s.Consumed)
				}
			}
			exists, err := srv.Do(ctx, "EXISTS", bs[0].key)
			if err != nil {
				t.Fatal(err)
			}
			if round == 0 && wrote != (exists == "1") {
				t.Fatalf("%s: written %v, but the key exists: %s", where, wrote, exists)
			}
		}
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
