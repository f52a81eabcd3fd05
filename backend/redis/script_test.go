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

// runScript runs decideLua for bs on a real server.
func runScript(t *testing.T, c rueidis.Client, now int64, refund bool, bs []scriptBucket) (bool, [][]bucket.State) {
	t.Helper()
	keys, argv := scriptArgs(now, refund, bs)
	reply, err := rueidis.NewLuaScript(decideLua).Exec(context.Background(), c, keys, argv).AsStrSlice()
	if err != nil {
		t.Fatalf("script: %v", err)
	}
	allowed, states, err := parseReply(bs, reply)
	if err != nil {
		t.Fatal(err)
	}
	return allowed, states
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
			sb := scriptBucket{key: key, cfg: fmt.Sprint(limits), limits: limits, costs: costs, ttlMs: ttl}
			gotAllowed, got := runScript(t, c, now, refund, []scriptBucket{sb})
			where := fmt.Sprintf("run %d step %d: limits %v, %d hits, refund %v, at %d", run, step, limits, hits, refund, now)
			if gotAllowed != allowed {
				t.Fatalf("%s: script allowed %v, bucket %v", where, gotAllowed, allowed)
			}
			if !slices.Equal(got[0], states) {
				t.Fatalf("%s:\n script states %+v\n bucket states %+v\n stored %+v", where, got[0], states, stored)
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
