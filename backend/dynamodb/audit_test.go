package dynamodb

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// After concurrent traffic from two replicas (takes, refunds and checks),
// a scan finds every bucket, each keeps every invariant, and the consumed
// totals add up to what was admitted. A bucket written out of
// bounds by hand is caught.
func TestAllBucketsAuditsTheTable(t *testing.T) {
	e := newEnv(t)
	// Leases off: consumed totals then equal what was admitted exactly
	// (leases_test.go audits with leases on).
	replicas := []*Backend{e.replica(t, Options{KeyPrefix: "p", LeaseHorizon: -1}), e.replica(t, Options{KeyPrefix: "p", LeaseHorizon: -1})}
	other := e.replica(t, Options{}) // another deployment in the same table
	defaults := []bucket.Limit{lim(t, "rps", "20/s", 0), lim(t, "day", "1000/day", 0)}

	var mu sync.Mutex
	admitted := map[string]int64{} // entity -> millitokens admitted (a refund leaves tc alone)
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := replicas[w%2]
			for i := 0; i < 40; i++ {
				req := backend.Request{Entity: []string{"a", "b", "c"}[i%3], Resource: "api", Defaults: defaults, Hits: uint64(1 + i%3)}
				switch {
				case i%7 == 3:
					req.Refund, req.Hits = true, 1
				case i%11 == 5:
					req.Hits = 0
				}
				d, err := b.Decide(context.Background(), &req)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed && !req.Refund {
					mu.Lock()
					admitted[req.Entity] += int64(req.Hits) * 1000
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	mustDecide(t, other, backend.Request{Entity: "a", Resource: "api", Defaults: defaults, Hits: 1})

	a := e.admin(t, "p")
	seen := map[string]backend.Bucket{}
	if err := a.AllBuckets(t.Context(), func(b backend.Bucket) error {
		seen[b.Entity] = b
		if v := b.Violations(e.clock.now(), 0); len(v) > 0 {
			t.Errorf("violations after traffic: %v", v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 3 {
		t.Fatalf("audit found buckets %v, want a, b and c of prefix p only", seen)
	}
	for entity, b := range seen {
		for i, s := range b.States {
			if s.Consumed != admitted[entity] {
				t.Errorf("%s limit %s: consumed %d, admitted %d", entity, b.Limits[i].Name, s.Consumed, admitted[entity])
			}
		}
	}

	// A bucket pushed past its burst by a foreign writer is reported.
	_, err := e.client.UpdateItem(t.Context(), &dynamodb.UpdateItemInput{
		TableName:                 aws.String(e.table),
		Key:                       map[string]types.AttributeValue{attrPK: str("p/ENTITY#b"), attrSK: str("#BUCKET#api")},
		UpdateExpression:          aws.String("SET b_rps_tk = :v"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":v": num(20001)},
	})
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	if err := a.AllBuckets(t.Context(), func(b backend.Bucket) error {
		found = append(found, b.Violations(e.clock.now(), 0)...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(found) != 1 || !strings.Contains(found[0], `"b"/"api"`) || !strings.Contains(found[0], "20001 millitokens") {
		t.Fatalf("audit of a corrupted bucket: %q", found)
	}
}
