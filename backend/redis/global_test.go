package redis

import (
	"context"
	"testing"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
	"github.com/sluice-rl/sluice/regions"
)

// TestGlobalLimitSplitByRegion: two regions, each on a Redis of its own
// (here two key prefixes of one redis-server), weighted 3 to 1, share a
// global limit of 400/s (burst 400) exactly: 300 and 100 at once, then
// their parts of the rate.
func TestGlobalLimitSplitByRegion(t *testing.T) {
	srv := redistest.Require(t)
	client := newClient(t, srv)
	split, err := regions.NewSplit(map[regions.Region]int64{"us-east-1": 3, "eu-west-1": 1})
	if err != nil {
		t.Fatal(err)
	}
	clk := newFakeClock()
	fleet := map[regions.Region]*Backend{}
	for _, name := range split.Regions() {
		g, err := backend.NewGlobal(split, name)
		if err != nil {
			t.Fatal(err)
		}
		fleet[name] = newBackend(t, client, Options{KeyPrefix: "g-" + string(name), Global: g, Now: clk.now, LeaseHorizon: -1})
	}
	limit := specLimits(t, []bucket.Spec{{Name: "rps", Rate: "400/s"}})
	admit := func() map[regions.Region]int {
		counts := map[regions.Region]int{}
		for name, b := range fleet {
			for range 500 {
				d, err := b.Decide(context.Background(), &backend.Request{Entity: "tenant-1", Resource: "api", Defaults: limit, Hits: 1, Global: true})
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					counts[name]++
				}
			}
		}
		return counts
	}
	if got := admit(); got["us-east-1"] != 300 || got["eu-west-1"] != 100 {
		t.Errorf("the burst: us-east-1 admitted %d, eu-west-1 %d; want 300 and 100", got["us-east-1"], got["eu-west-1"])
	}
	clk.advance(500)
	if got := admit(); got["us-east-1"] != 150 || got["eu-west-1"] != 50 {
		t.Errorf("half a second on: us-east-1 admitted %d, eu-west-1 %d; want 150 and 50", got["us-east-1"], got["eu-west-1"])
	}
}

// TestGlobalShareFollowsRecord: on Redis as on DynamoDB, a replica whose
// shares move enforces its base plus the loan its region's record holds,
// then its base once the loan is given back and its copy has aged past
// CacheFor; a damaged record fails the decision.
func TestGlobalShareFollowsRecord(t *testing.T) {
	srv := redistest.Require(t)
	client := newClient(t, srv)
	split, err := regions.NewSplit(map[regions.Region]int64{"us-east-1": 3, "eu-west-1": 1})
	if err != nil {
		t.Fatal(err)
	}
	clock := regions.Clock{Window: 10_000, Skew: 1_000, Hold: 500}
	g, err := backend.NewGlobal(split, "eu-west-1")
	if err != nil {
		t.Fatal(err)
	}
	if g, err = g.Moving(clock); err != nil {
		t.Fatal(err)
	}
	clk := newFakeClock()
	clk.ms.Store(clock.Start(clock.At(clk.now())+1) + 5_000) // mid-slot
	m := clock.At(clk.now())
	admin := newAdmin(t, client, "moving", nil)
	ctx := context.Background()
	loan := regions.Loan{Made: m - 2, From: m - 1, To: m + 3, Parts: 250_000}
	if _, err := admin.PutShare(ctx, "tenant-1", "api", regions.Record{In: map[regions.Region]regions.Loans{"us-east-1": {loan}}}, 0, 0); err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, client, Options{KeyPrefix: "moving", Global: g, Now: clk.now, LeaseHorizon: -1})
	limit := specLimits(t, []bucket.Spec{{Name: "rps", Rate: "400/s"}})
	admitted := func(entity string) int {
		n := 0
		for range 300 {
			d, err := b.Decide(ctx, &backend.Request{Entity: entity, Resource: "api", Defaults: limit, Hits: 1, Global: true})
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				n++
			}
		}
		return n
	}
	if got := admitted("tenant-1"); got != 200 {
		t.Errorf("with the loan: admitted %d, want 200", got)
	}
	if got := admitted("tenant-2"); got != 100 {
		t.Errorf("no record: admitted %d, want 100", got)
	}
	loan.Back = m + 1
	if _, err := admin.PutShare(ctx, "tenant-1", "api", regions.Record{In: map[regions.Region]regions.Loans{"us-east-1": {loan}}}, 1, 0); err != nil {
		t.Fatal(err)
	}
	clk.advance(clock.Window)
	if got := admitted("tenant-1"); got != 100 {
		t.Errorf("after the loan went back: admitted %d, want 100", got)
	}
	if _, err := srv.Do(ctx, "HSET", admin.keys.Share("tenant-3", "api"), "ver", "1", "sh", "{"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Decide(ctx, &backend.Request{Entity: "tenant-3", Resource: "api", Defaults: limit, Hits: 1, Global: true}); err == nil {
		t.Error("a decision on a damaged share record answered")
	}
}
