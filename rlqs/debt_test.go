package rlqs_test

import (
	"context"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/rlqs"
)

// An Envoy's quota comes out of the same bucket as the charges that
// gateways send after their responses (backend.Request.Charge): a bucket
// a charge has put into debt gives the Envoy no tokens, only a denial,
// until refill has repaid the debt.
func TestNoAssignmentFromABucketInDebt(t *testing.T) {
	be := memory.New(memory.Options{})
	t.Cleanup(func() { be.Close() })
	r := rules(t, 1000)
	m, ok := r.Config.Match("quota", &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "api", Value: "search"}}})
	if !ok {
		t.Fatal("the quota rules do not match api=search")
	}
	// 1,000 a second with a burst of 1,000: a charge of 3,000 takes the
	// bucket to its floor, a burst below zero, repaid in a second.
	if _, err := be.Decide(context.Background(), &backend.Request{Entity: m.Entity, Resource: m.Resource,
		Defaults: m.Rule.Limits, Hits: 3000, Charge: true}); err != nil {
		t.Fatal(err)
	}
	_, conn := replica(t, r, be, rlqs.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := map[string]string{"api": "search"}
	if err := stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "quota",
		BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(id, 0, 1, 0)}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetBucketAction()) != 1 {
		t.Fatalf("%d actions, want one", len(resp.GetBucketAction()))
	}
	a := resp.GetBucketAction()[0].GetQuotaAssignmentAction()
	if a.GetRateLimitStrategy().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		t.Fatalf("first assignment on a bucket in debt: %v, want DENY_ALL", a)
	}
	// Repaid a second later, the bucket gives the Envoy tokens again.
	time.Sleep(1500 * time.Millisecond)
	if err := stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "quota",
		BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(id, time.Second, 0, 10)}}); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("no token bucket after the debt was repaid: %v", err)
		}
		for _, act := range resp.GetBucketAction() {
			if tb := act.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb.GetTokensPerFill().GetValue() > 0 {
				return
			}
		}
	}
}
