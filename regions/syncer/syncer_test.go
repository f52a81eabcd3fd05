package syncer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	ddb "github.com/sluice-rl/sluice/backend/dynamodb"
	"github.com/sluice-rl/sluice/backend/dynamodb/dynamodbtest"
	"github.com/sluice-rl/sluice/regions"
	"github.com/sluice-rl/sluice/regions/syncer"
)

func TestMain(m *testing.M) { dynamodbtest.Main(m) }

// TestSyncMovesSharesBetweenTables runs two regions, each on a table of
// its own with a replica and a sync, weighted 3 to 1 for a global limit
// of 400/s (burst 400). With demand in the small region only, the big
// region's sync lends it its base, and two windows on the small region's
// replica admits the whole burst while the big region's admits nothing.
// When demand moves to the big region, the loan goes back and the small
// region lends its own base: three windows on, the big region admits the
// whole burst. At every step the two replicas together admit at most the
// limit's burst.
func TestSyncMovesSharesBetweenTables(t *testing.T) {
	srv := dynamodbtest.Require(t)
	client := srv.Client(context.Background())
	clock := regions.Clock{Window: 10_000, Skew: 1_000, Hold: 500}
	var now atomic.Int64
	now.Store(clock.Start(clock.At(time.Now().UnixMilli())+1) + 500) // early in a slot, before the loans' deadline
	split, err := regions.NewSplit(map[regions.Region]int64{"us-east-1": 3, "eu-west-1": 1})
	if err != nil {
		t.Fatal(err)
	}
	names := split.Regions()
	stores := map[regions.Region]syncer.Store{}
	replicas := map[regions.Region]*ddb.Backend{}
	for _, r := range names {
		table := srv.NewTable(t, func(ctx context.Context, c *dynamodb.Client, name string) error {
			_, err := ddb.CreateTable(ctx, c, name)
			return err
		})
		admin, err := ddb.NewAdmin(client, table, "", now.Load)
		if err != nil {
			t.Fatal(err)
		}
		stores[r] = admin
		g, err := backend.NewGlobal(split, r)
		if err != nil {
			t.Fatal(err)
		}
		if g, err = g.Moving(clock); err != nil {
			t.Fatal(err)
		}
		b, err := ddb.New(client, ddb.Options{Table: table, Global: g, LeaseHorizon: -1, Now: now.Load})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		replicas[r] = b
	}
	demand := map[regions.Region]int64{"us-east-1": 0, "eu-west-1": 800_000}
	syncs := map[regions.Region]*syncer.Sync{}
	for _, r := range names {
		syncs[r] = &syncer.Sync{Me: r, Split: split, Clock: clock, Stores: stores, Budget: time.Second, Now: now.Load,
			Demand: func(_ context.Context, region regions.Region, _ syncer.Key) (int64, error) {
				return demand[region], nil
			}}
	}
	key := syncer.Key{Entity: "tenant-1", Resource: "api"}
	step := func() {
		t.Helper()
		for _, r := range names {
			if res, err := syncs[r].Step(context.Background(), key); err != nil || len(res.Unread)+len(res.Refused) > 0 {
				t.Fatalf("%s's sync: %v (unread %v, refused %v)", r, err, res.Unread, res.Refused)
			}
		}
	}
	spec := bucket.Spec{Name: "rps", Rate: "400/s"}
	l, err := spec.Limit()
	if err != nil {
		t.Fatal(err)
	}
	// drain asks each region's replica for more than the burst, in the
	// middle of the current slot, and counts what each admits.
	drain := func() map[regions.Region]int {
		t.Helper()
		got := map[regions.Region]int{}
		for _, r := range names {
			for range 500 {
				d, err := replicas[r].Decide(context.Background(), &backend.Request{Entity: key.Entity, Resource: key.Resource,
					Defaults: []bucket.Limit{l}, Hits: 1, Global: true})
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					got[r]++
				}
			}
		}
		if sum := got["us-east-1"] + got["eu-west-1"]; sum > 400 {
			t.Errorf("the regions admitted %d together (%v), over the burst of 400", sum, got)
		}
		return got
	}
	// Before any sync: the bases, 300 and 100.
	now.Add(4_000)
	if got := drain(); got["us-east-1"] != 300 || got["eu-west-1"] != 100 {
		t.Errorf("the bases: admitted %v, want 300 and 100", got)
	}
	// Windows on, the small region's demand borrows the big one's base.
	for range 2 {
		now.Add(clock.Window)
		now.Store(clock.Start(clock.At(now.Load())) + 500)
		step()
	}
	// A bucket takes new limits with the tokens it held (never more): the
	// first drain empties it under them, the second finds what 2 s of
	// the new rate refilled, up to the new burst.
	now.Add(4_000)
	drain()
	now.Add(2_000)
	if got := drain(); got["eu-west-1"] != 400 || got["us-east-1"] != 0 {
		t.Errorf("demand in eu-west-1 only: admitted %v, want all 400 there", got)
	}
	// Demand moves: within three windows the big region holds it all.
	demand["us-east-1"], demand["eu-west-1"] = 800_000, 0
	for range 3 {
		now.Add(clock.Window)
		now.Store(clock.Start(clock.At(now.Load())) + 500)
		step()
		now.Add(4_000)
		drain()
	}
	now.Add(clock.Window)
	drain()
	now.Add(2_000)
	if got := drain(); got["us-east-1"] != 400 || got["eu-west-1"] != 0 {
		t.Errorf("demand moved to us-east-1: admitted %v, want all 400 there", got)
	}
}
