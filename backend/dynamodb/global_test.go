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

// TestGlobalShareFollowsRecord: a replica of a region whose shares move
// enforces what its region's share record gives it: its base plus a loan
// it holds, then its base again once the loan is given back and its copy
// of the record has aged past CacheFor. A record that cannot be decoded
// fails the decision rather than enforce the base.
func TestGlobalShareFollowsRecord(t *testing.T) {
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
	e := newEnv(t)
	// The middle of a slot, away from the edges InForce looks across.
	e.clock.ms.Store(clock.Start(clock.At(e.clock.now())+1) + 5_000)
	m := clock.At(e.clock.now())
	admin := e.admin(t, "")
	ctx := context.Background()
	loan := regions.Loan{Made: m - 2, From: m - 1, To: m + 3, Parts: 250_000}
	if _, err := admin.PutShare(ctx, "tenant-1", "api", regions.Record{In: map[regions.Region]regions.Loans{"us-east-1": {loan}}}, 0, 0); err != nil {
		t.Fatal(err)
	}
	b := e.replica(t, Options{Global: g, LeaseHorizon: -1})
	limit := []bucket.Limit{lim(t, "rps", "400/s", 400)}
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
	// Its base (a quarter) and the loan (another quarter): half of 400.
	if got := admitted("tenant-1"); got != 200 {
		t.Errorf("with the loan: admitted %d, want 200", got)
	}
	// A key with no record: the base.
	if got := admitted("tenant-2"); got != 100 {
		t.Errorf("no record: admitted %d, want 100", got)
	}
	// The loan given back from the next slot.
	loan.Back = m + 1
	if _, err := admin.PutShare(ctx, "tenant-1", "api", regions.Record{In: map[regions.Region]regions.Loans{"us-east-1": {loan}}}, 1, 0); err != nil {
		t.Fatal(err)
	}
	e.clock.advance(clock.Window) // the next slot, past CacheFor
	if got := admitted("tenant-1"); got != 100 {
		t.Errorf("after the loan went back: admitted %d, want 100 (the base's burst)", got)
	}
	// A damaged record.
	if _, err := e.client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(e.table), Item: map[string]types.AttributeValue{
		attrPK: str(admin.keys.EntityPK("tenant-3")), attrSK: str(admin.keys.ShareSK("api")), attrShare: str("{"), attrShareVer: num(1),
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Decide(ctx, &backend.Request{Entity: "tenant-3", Resource: "api", Defaults: limit, Hits: 1, Global: true}); err == nil {
		t.Error("a decision on a damaged share record answered")
	}
}
