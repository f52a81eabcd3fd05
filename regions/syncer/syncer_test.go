package syncer_test

import (
	"context"
	"maps"
	"reflect"
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
// of 400/s (burst 400). The demand the syncs plan on is what the
// replicas were asked, written to their tables (backend/usage). With
// demand in the small region only, the big region's sync lends it its
// base, and three windows on the small region's replica admits the whole
// burst while the big region's admits nothing. When demand moves to the
// big region, the loan goes back and the small region lends its own
// base: three windows on, the big region admits the whole burst. At
// every step the two replicas together admit at most the limit's burst,
// and an operator's config of the key in one region's table is left as
// the operator wrote it.
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
	syncs := map[regions.Region]*syncer.Sync{}
	for _, r := range names {
		syncs[r] = &syncer.Sync{Me: r, Split: split, Clock: clock, Stores: stores, Budget: time.Second, Now: now.Load}
	}
	key := regions.Key{Entity: "tenant-1", Resource: "api"}
	l, err := (&bucket.Spec{Name: "rps", Rate: "400/s"}).Limit()
	if err != nil {
		t.Fatal(err)
	}
	// An operator wrote the key's limit into eu-west-1's table (the
	// rule's, so the counts below are the same): the syncs write their
	// share records beside it and never touch it.
	operator := backend.EntityKey(key.Entity, key.Resource)
	written, err := stores["eu-west-1"].(*ddb.Admin).PutConfig(context.Background(), operator, []bucket.Limit{l}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		got, ok, err := stores["eu-west-1"].(*ddb.Admin).GetConfig(context.Background(), operator)
		if err != nil || !ok || !reflect.DeepEqual(got, written) {
			t.Errorf("the operator's config after the syncs: %+v (found %v, %v), want it as written: %+v", got, ok, err, written)
		}
	}()
	decide := func(r regions.Region, hits uint64) bool {
		t.Helper()
		d, err := replicas[r].Decide(context.Background(), &backend.Request{Entity: key.Entity, Resource: key.Resource,
			Defaults: []bucket.Limit{l}, Hits: hits, Global: true})
		if err != nil {
			t.Fatal(err)
		}
		return d.Allowed
	}
	// next starts the next window as the replicas and syncs do: the
	// replicas write what they were asked in the last, and each region's
	// sync plans on it.
	next := func() map[regions.Region]syncer.Round {
		t.Helper()
		rounds := map[regions.Region]syncer.Round{}
		now.Store(clock.Start(clock.At(now.Load())+1) + 500)
		for _, r := range names {
			if err := replicas[r].Moving().Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		for _, r := range names {
			round := syncs[r].Round(context.Background())
			if len(round.Keys) != 1 || round.Keys[0].Key != key || len(round.Unread)+len(round.Refused)+len(round.Failed) > 0 {
				t.Fatalf("%s's sync: %+v", r, round)
			}
			rounds[r] = round
		}
		return rounds
	}
	// drain asks each region's replica for more than the burst, a
	// request at a time, and counts what each admits.
	drain := func() map[regions.Region]int {
		t.Helper()
		got := map[regions.Region]int{}
		for _, r := range names {
			for range 500 {
				if decide(r, 1) {
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
	// The small region is asked for 0.8 of the limit a window (3,200
	// tokens of a 400/s limit in 10 s: one request of them, denied, is
	// asked all the same). Its sync reads that a window later, and the
	// loan it is made starts a window after that: three windows on, the
	// small region holds the big one's base.
	for i := range 3 {
		decide("eu-west-1", 3_200)
		rounds := next()
		if i > 0 {
			continue
		}
		// The first window's demand: the drain's 500 requests in each
		// region (125,000 parts) and the 3,200 tokens.
		want := map[regions.Region]int64{"us-east-1": 125_000, "eu-west-1": 925_000}
		for _, r := range names {
			if got := rounds[r].Keys[0].Demand; !maps.Equal(got, want) {
				t.Errorf("%s's sync read demand %v, want %v", r, got, want)
			}
		}
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
	var last map[regions.Region]syncer.Round
	for range 3 {
		decide("us-east-1", 3_200)
		last = next()
	}
	now.Add(4_000)
	drain()
	now.Add(2_000)
	if got := last["us-east-1"].Keys[0].Shares; got["us-east-1"] != regions.Total || got["eu-west-1"] != 0 {
		t.Errorf("us-east-1's sync saw the shares %v, want all of the limit in us-east-1", got)
	}
	if got := drain(); got["us-east-1"] != 400 || got["eu-west-1"] != 0 {
		t.Errorf("demand moved to us-east-1: admitted %v, want all 400 there", got)
	}
	// What an operator sees (sluice shares), from either region: the
	// limit all in us-east-1, and a key no sync planned at its bases.
	other := regions.Key{Entity: "tenant-2", Resource: "api"}
	rows, unread := syncs["eu-west-1"].Survey(context.Background(), []regions.Key{key, other})
	if len(unread) > 0 || len(rows) != 2 {
		t.Fatalf("survey: %+v, unread %v", rows, unread)
	}
	if got := rows[0].Shares; got["us-east-1"] != regions.Total || got["eu-west-1"] != 0 {
		t.Errorf("survey of %v: shares %v, want all of the limit in us-east-1", key, got)
	}
	if got := rows[1].Shares; got["us-east-1"] != 750_000 || got["eu-west-1"] != 250_000 {
		t.Errorf("survey of %v: shares %v, want the bases", other, got)
	}
}
