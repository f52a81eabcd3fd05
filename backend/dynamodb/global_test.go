package dynamodb

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/backendtest"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/regions"
)

// TestGlobalLimitSplitByRegion runs a global limit of 400/s (burst 400)
// in two regions, each on a table of its own with two replicas, weighted
// 3 to 1: each region admits exactly its part, its burst and then its
// part of the rate, and the two together exactly the limit's, with no
// call between them. A rule that is not global is enforced whole in each.
func TestGlobalLimitSplitByRegion(t *testing.T) {
	split, err := regions.NewSplit(map[regions.Region]int64{"us-east-1": 3, "eu-west-1": 1})
	if err != nil {
		t.Fatal(err)
	}
	us, eu := newEnv(t), newEnv(t)
	eu.clock = us.clock // one true time
	fleet := map[regions.Region][]*Backend{}
	for name, e := range map[regions.Region]*env{"us-east-1": us, "eu-west-1": eu} {
		g, err := backend.NewGlobal(split, name)
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			// No leases: every admission is a token out of the region's
			// bucket, so the counts are exact.
			fleet[name] = append(fleet[name], e.replica(t, Options{Global: g, LeaseHorizon: -1}))
		}
	}
	limit := []bucket.Limit{lim(t, "rps", "400/s", 400)}
	admit := func(global bool, calls int) map[regions.Region]int {
		counts := map[regions.Region]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for name, replicas := range fleet {
			for _, b := range replicas {
				wg.Go(func() {
					var n atomic.Int64
					for range calls {
						d, err := b.Decide(context.Background(), &backend.Request{Entity: "tenant-1", Resource: "api", Defaults: limit, Hits: 1, Global: global})
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							n.Add(1)
						}
					}
					mu.Lock()
					counts[name] += int(n.Load())
					mu.Unlock()
				})
			}
		}
		wg.Wait()
		return counts
	}
	if got := admit(true, 250); got["us-east-1"] != 300 || got["eu-west-1"] != 100 {
		t.Errorf("the burst: us-east-1 admitted %d, eu-west-1 %d; want 300 and 100", got["us-east-1"], got["eu-west-1"])
	}
	us.clock.advance(500)
	if got := admit(true, 250); got["us-east-1"] != 150 || got["eu-west-1"] != 50 {
		t.Errorf("half a second on: us-east-1 admitted %d, eu-west-1 %d; want 150 and 50", got["us-east-1"], got["eu-west-1"])
	}
	// Another resource, not global: each region holds the whole limit.
	limit = []bucket.Limit{lim(t, "rps", "400/s", 400)}
	local := func() map[regions.Region]int {
		counts := map[regions.Region]int{}
		for name, replicas := range fleet {
			for range 500 {
				d := mustDecide(t, replicas[0], backend.Request{Entity: "tenant-1", Resource: "local", Defaults: limit, Hits: 1})
				if d.Allowed {
					counts[name]++
				}
			}
		}
		return counts
	}
	if got := local(); got["us-east-1"] != 400 || got["eu-west-1"] != 400 {
		t.Errorf("a rule not global: us-east-1 admitted %d, eu-west-1 %d; want 400 each", got["us-east-1"], got["eu-west-1"])
	}
}

// TestGlobalShareFollowsRecord: a replica whose shares move enforces
// what its region's share record gives it (backendtest.ShareFollowsRecord).
func TestGlobalShareFollowsRecord(t *testing.T) {
	e := newEnv(t)
	clock := backendtest.GlobalClock()
	e.clock.ms.Store(clock.Start(clock.At(e.clock.now())+1) + 5_000)
	admin := e.admin(t, "")
	ctx := context.Background()
	backendtest.ShareFollowsRecord(t, backendtest.ShareWorld{
		Backend: e.replica(t, Options{Global: backendtest.MovingGlobal(t), LeaseHorizon: -1}),
		Put: func(entity string, rec regions.Record, version int64) {
			if _, err := admin.PutShare(ctx, entity, "api", rec, version, 0); err != nil {
				t.Fatal(err)
			}
		},
		Now: e.clock.now, Advance: e.clock.advance,
		Damage: func(entity string) {
			if _, err := e.client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(e.table), Item: map[string]types.AttributeValue{
				attrPK: str(admin.keys.EntityPK(entity)), attrSK: str(admin.keys.ShareSK("api")), attrShare: str("{"), attrShareVer: num(1),
			}}); err != nil {
				t.Fatal(err)
			}
		},
	})
}

// TestLeaseEndsWithItsShare: with leases on, tokens a replica leased
// under a larger share are not spent once the share is smaller: a lease
// holds tokens under its limits' fingerprint, and the new share's limits
// are others. So tokens leased under one slot's share are never spent
// under the next's (regions.Clock.Hold need only cover a decision).
func TestLeaseEndsWithItsShare(t *testing.T) {
	e := newEnv(t)
	clock := backendtest.GlobalClock()
	e.clock.ms.Store(clock.Start(clock.At(e.clock.now())+1) + 5_000)
	m := clock.At(e.clock.now())
	admin := e.admin(t, "")
	ctx := context.Background()
	loan := regions.Loan{Made: m - 2, From: m - 1, To: m + 3, Parts: 250_000}
	put := func(rec regions.Record, version int64) {
		if _, err := admin.PutShare(ctx, "tenant-1", "api", rec, version, 0); err != nil {
			t.Fatal(err)
		}
	}
	put(regions.Record{In: map[regions.Region]regions.Loans{"us-east-1": {loan}}}, 0)
	b := e.replica(t, Options{Global: backendtest.MovingGlobal(t)}) // leases on
	limit := []bucket.Limit{lim(t, "rps", "400/s", 400)}
	admitted := func(calls int) int {
		n := 0
		for range calls {
			d, err := b.Decide(ctx, &backend.Request{Entity: "tenant-1", Resource: "api", Defaults: limit, Hits: 1, Global: true})
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				n++
			}
		}
		return n
	}
	// A few calls under the larger share: the replica leases ahead.
	if got := admitted(20); got != 20 {
		t.Fatalf("under the larger share: %d of 20 admitted", got)
	}
	if b.Stats().LeaseOutstanding.Load() == 0 {
		t.Fatal("no lease taken: the test shows nothing")
	}
	loan.Back = m + 1
	put(regions.Record{In: map[regions.Region]regions.Loans{"us-east-1": {loan}}}, 1)
	e.clock.advance(clock.Window)
	// The base's burst is 100; the bucket held at most 200 - 20 under
	// the old share, and is cut to 100 when it takes the new limits. Any
	// token of the old lease spent on top would show past 100.
	if got := admitted(400); got > 100 {
		t.Errorf("under the smaller share: admitted %d, over its burst of 100", got)
	}
}

// TestGlobalUsageAddsUp: what the replicas of a region were asked for
// global keys reaches its table, summed (backendtest.UsageAddsUp).
func TestGlobalUsageAddsUp(t *testing.T) {
	e := newEnv(t)
	clock := backendtest.GlobalClock()
	e.clock.ms.Store(clock.Start(clock.At(e.clock.now())+1) + 5_000)
	admin := e.admin(t, "")
	ctx := context.Background()
	var replicas [2]*Backend
	for i := range replicas {
		replicas[i] = e.replica(t, Options{Global: backendtest.MovingGlobal(t), LeaseHorizon: -1})
	}
	backendtest.UsageAddsUp(t, backendtest.UsageWorld{
		Replicas: [2]backend.Backend{replicas[0], replicas[1]},
		Flush:    func(i int) error { return replicas[i].Moving().Flush(ctx) },
		Usage:    func(slot regions.Slot) (map[regions.Key]int64, error) { return admin.Usage(ctx, slot) },
		Damage: func(slot regions.Slot) {
			if _, err := e.client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(e.table), Item: map[string]types.AttributeValue{
				attrPK: str(admin.keys.UsagePK(slot, 3)), attrSK: str(usageSKMarker + "x#0"), attrUsage: str(`[["a","b",-1]]`),
			}}); err != nil {
				t.Fatal(err)
			}
		},
		Now: e.clock.now, Advance: e.clock.advance,
	})
}
