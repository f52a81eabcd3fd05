package redis

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// groupCalls, on random batches where keys recur with other limits, other
// TTLs and other cascade parents: every call lands once, in the one group
// of its exact buckets, groups come in order of first arrival and calls
// in arrival order within them, and each call's costs are its own.
func TestGroupCalls(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	limitSets := [][]bucket.Limit{
		{{Name: "rps", Amount: 1000, Period: 1000, Burst: 1000}},
		{{Name: "rps", Amount: 2000, Period: 1000, Burst: 2000}},
		{{Name: "rpm", Amount: 1000, Period: 60000, Burst: 1000}, {Name: "rps", Amount: 1000, Period: 1000, Burst: 1000}},
	}
	bucketOf := func() scriptBucket {
		ls := limitSets[r.IntN(len(limitSets))]
		return scriptBucket{key: []string{"a", "b", "c"}[r.IntN(3)], cfg: bucket.Fingerprint(ls), limits: ls, ttlMs: int64(r.IntN(2))}
	}
	for range 2000 {
		batch := make([]*pending, 1+r.IntN(40))
		for i := range batch {
			bs := []scriptBucket{bucketOf()}
			if r.IntN(4) == 0 {
				bs = append(bs, bucketOf()) // a cascade's parent
			}
			batch[i] = &pending{buckets: bs, call: scriptCall{refund: r.IntN(5) == 0, costs: []int64{int64(i)}}}
		}
		groups, at := groupCalls(batch)
		if len(at) != len(batch) {
			t.Fatalf("%d places for %d calls", len(at), len(batch))
		}
		seen := 0
		for g := range groups {
			seen += len(groups[g].calls)
			for h := range g {
				if sameBuckets(groups[h].buckets, groups[g].buckets) {
					t.Fatalf("groups %d and %d are on the same buckets", h, g)
				}
			}
		}
		if seen != len(batch) {
			t.Fatalf("groups hold %d calls, the batch %d", seen, len(batch))
		}
		last := make([]int, len(groups))
		for g := range last {
			last[g] = -1
		}
		firstGroup := -1
		for i, p := range batch {
			g := groups[at[i].group]
			if !sameBuckets(g.buckets, p.buckets) {
				t.Fatalf("call %d in a group on other buckets", i)
			}
			c := g.calls[at[i].call]
			if c.refund != p.call.refund || !slices.Equal(c.costs, p.call.costs) {
				t.Fatalf("call %d's place holds another call", i)
			}
			if at[i].call != last[at[i].group]+1 {
				t.Fatalf("call %d is number %d of its group, after %d", i, at[i].call, last[at[i].group])
			}
			last[at[i].group] = at[i].call
			if at[i].group > firstGroup+1 {
				t.Fatalf("group %d opened before group %d", at[i].group, firstGroup+1)
			}
			firstGroup = max(firstGroup, at[i].group)
		}
	}
}
