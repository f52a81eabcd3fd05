package ratelimit_test

import (
	"context"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/backendtest"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/ratelimit"
)

// stormRules is a tenant's token limit of 1,000 a second in
// envoyproxy/ratelimit's format (its burst and debt the defaults: one
// second's worth each), as the gateways' rules arrive.
const stormRules = `
domain: llm
descriptors:
  - key: tenant
    rate_limit: {name: tpm, unit: second, requests_per_unit: 1000}
`

// gatewayCalls is a gateway sending backendtest.ChargeStorm's calls over
// gRPC in its own shape: a check is the tenant's descriptor as the
// gateway sends it at request time (check), a charge its own hits_addend
// after the response, less what the check took (taken). The storm's
// decision is the answer's overall code.
// With charger set, the charges go to that replica instead, as Envoy's
// load balancing may send a request's two calls to two replicas.
type gatewayCalls struct {
	c       rlsv3.RateLimitServiceClient
	check   func() *rlv3.RateLimitDescriptor
	taken   uint64
	charger rlsv3.RateLimitServiceClient
}

func (g gatewayCalls) Decide(ctx context.Context, req *backend.Request) (backend.Decision, error) {
	d, c := g.check(), g.c
	if req.Charge {
		d = withHits(tenant(), req.Hits-g.taken)
		if g.charger != nil {
			c = g.charger
		}
	}
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlv3.RateLimitDescriptor{d}})
	if err != nil {
		return backend.Decision{}, err
	}
	return backend.Decision{Allowed: resp.GetOverallCode() == rlsv3.RateLimitResponse_OK}, nil
}

// The charge storm of the backends' TestChargesHoldTheBound, through each
// gateway's calls over gRPC, on rules that say nothing of charges: 10
// clients check, wait 50 ms while the model answers, then charge, each
// request 100 tokens in all, on one tenant's 1,000 a second. The rules'
// format has no debt key, so the debt is the default, one burst: as much
// as the 10 requests in flight can use past zero (K*N), which the bound
// needs (with 20 clients the floor forgave what they used beyond it, and
// 6,100 tokens were used where B + R*T + K*N is 6,002). Which call
// is a charge is Sluice's default rule (a descriptor's own hits_addend),
// so every gateway's charges land: the tokens admitted requests used lie
// within [0.8, 1] of B + R*T with the K*N of requests in flight, and the
// bucket counts every charge. Envoy AI Gateway's request-time call has
// no hits and takes one token, so its charge is 99.
func TestGatewayChargeStorms(t *testing.T) {
	for _, g := range gatewayPatterns() {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			be := memory.New(memory.Options{SweepInterval: -1})
			t.Cleanup(func() { be.Close() })
			c := serve(t, ratelimit.New(rules(t, stormRules), be, ratelimit.Options{}))
			load := backendtest.ChargeLoad{Clients: 10, Tokens: 100, Think: 50 * time.Millisecond, Backoff: 5 * time.Millisecond, Run: 3 * time.Second}
			r := backendtest.ChargeStorm([]backendtest.Decider{gatewayCalls{c: c, check: g.check, taken: g.taken}}, backend.Request{}, load)
			l := bucket.Limit{Name: "tpm", Amount: 1000 * bucket.Milli, Period: bucket.Second, Burst: 1000 * bucket.Milli}
			r.HoldsTheBound(t, l, load)
			snap, ok := be.Snapshot("t1", "llm/tenant")
			if !ok {
				t.Fatal("no bucket for the tenant (entity t1, resource llm/tenant)")
			}
			r.Counted(t, snap.States[0].Consumed, load)
		})
	}
}

// gatewayPattern is what a gateway sends at request time (check) and how
// much of the request's tokens that took (taken).
type gatewayPattern struct {
	name  string
	check func() *rlv3.RateLimitDescriptor
	taken uint64
}

// gatewayPatterns are the three gateways' calls: Envoy Gateway's cost
// rules and agentgateway check with the descriptor's own zero; Envoy AI
// Gateway's QuotaPolicy sends no hits, so one.
func gatewayPatterns() []gatewayPattern {
	zero := func() *rlv3.RateLimitDescriptor { return withHits(tenant(), 0) }
	return []gatewayPattern{
		{"Envoy Gateway cost.request 0, cost.response", zero, 0},
		{"Envoy AI Gateway QuotaPolicy", tenant, 1},
		{"agentgateway", zero, 0},
	}
}
