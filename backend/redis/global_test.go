package redis

import (
	"context"
	"testing"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/backendtest"
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
// shares move enforces what its region's share record gives it
// (backendtest.ShareFollowsRecord).
func TestGlobalShareFollowsRecord(t *testing.T) {
	srv := redistest.Require(t)
	client := newClient(t, srv)
	clk := newFakeClock()
	clock := backendtest.GlobalClock()
	clk.ms.Store(clock.Start(clock.At(clk.now())+1) + 5_000)
	admin := newAdmin(t, client, "moving", nil)
	ctx := context.Background()
	backendtest.ShareFollowsRecord(t, backendtest.ShareWorld{
		Backend: newBackend(t, client, Options{KeyPrefix: "moving", Global: backendtest.MovingGlobal(t), Now: clk.now, LeaseHorizon: -1}),
		Put: func(entity string, rec regions.Record, version int64) {
			if _, err := admin.PutShare(ctx, entity, "api", rec, version, 0); err != nil {
				t.Fatal(err)
			}
		},
		Now: clk.now, Advance: clk.advance,
		Damage: func(entity string) {
			if _, err := srv.Do(ctx, "HSET", admin.keys.Share(entity, "api"), "ver", "1", "sh", "{"); err != nil {
				t.Fatal(err)
			}
		},
	})
}

// TestGlobalUsageAddsUp: on Redis as on DynamoDB, what the replicas of a
// region were asked for global keys reaches its store, summed
// (backendtest.UsageAddsUp).
func TestGlobalUsageAddsUp(t *testing.T) {
	srv := redistest.Require(t)
	client := newClient(t, srv)
	clk := newFakeClock()
	clock := backendtest.GlobalClock()
	clk.ms.Store(clock.Start(clock.At(clk.now())+1) + 5_000)
	admin := newAdmin(t, client, "usage", nil)
	ctx := context.Background()
	var replicas [2]*Backend
	for i := range replicas {
		replicas[i] = newBackend(t, client, Options{KeyPrefix: "usage", Global: backendtest.MovingGlobal(t), Now: clk.now, LeaseHorizon: -1})
	}
	backendtest.UsageAddsUp(t, backendtest.UsageWorld{
		Replicas: [2]backend.Backend{replicas[0], replicas[1]},
		Flush:    func(i int) error { return replicas[i].Moving().Flush(ctx) },
		Usage:    func(slot regions.Slot) (map[regions.Key]int64, error) { return admin.Usage(ctx, slot) },
		Damage: func(slot regions.Slot) {
			if _, err := srv.Do(ctx, "HSET", admin.keys.Usage(slot, 3), "x#0", `[["a","b",-1]]`); err != nil {
				t.Fatal(err)
			}
		},
		Now: clk.now, Advance: clk.advance,
	})
}
