package ratelimit_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/ratelimit"
)

// chargeRules is one tenant's token limit in envoyproxy/ratelimit's
// format, as Envoy Gateway and the AI gateways generate it: no Sluice
// key says which calls are charges.
const chargeRules = `
domain: llm
descriptors:
  - key: tenant
    rate_limit: {name: tpm, unit: minute, requests_per_unit: 1000}
`

func tenant() *rlv3.RateLimitDescriptor { return desc("tenant", "t1") }

func withHits(d *rlv3.RateLimitDescriptor, h uint64) *rlv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(h)
	return d
}

// The three gateways' patterns on a tenant whose requests used more than
// its limit: Envoy Gateway's cost rules (a check of the descriptor's own
// zero, then its own N at stream end), Envoy AI Gateway's QuotaPolicy
// (no hits at request time, so one; its cost at stream end) and
// agentgateway (zero, then the tokens). Every charge lands, the tenant's
// next request is denied, and a plain flood at the exhausted limit takes
// nothing.
func TestGatewayChargesAfterTheResponse(t *testing.T) {
	for _, g := range []struct {
		name    string
		request func() *rlv3.RateLimitDescriptor
	}{
		{"Envoy Gateway cost.request 0, cost.response", func() *rlv3.RateLimitDescriptor { return withHits(tenant(), 0) }},
		{"Envoy AI Gateway QuotaPolicy", tenant},
		{"agentgateway", func() *rlv3.RateLimitDescriptor { return withHits(tenant(), 0) }},
	} {
		t.Run(g.name, func(t *testing.T) {
			be := memory.New(memory.Options{SweepInterval: -1})
			t.Cleanup(func() { be.Close() })
			c := serve(t, ratelimit.New(rules(t, chargeRules), be, ratelimit.Options{}))
			ask := func(d *rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse_DescriptorStatus {
				return call(t, c, &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlv3.RateLimitDescriptor{d}}).Statuses[0]
			}
			// Three requests admitted together, each of whose responses
			// then uses 600 tokens: 1,800 of a limit of 1,000.
			for i := range 3 {
				if st := ask(g.request()); st.Code != rlsv3.RateLimitResponse_OK {
					t.Fatalf("request %d at request time: %v", i, st)
				}
			}
			for range 3 {
				ask(withHits(tenant(), 600))
			}
			st := ask(g.request())
			if st.Code != rlsv3.RateLimitResponse_OVER_LIMIT || st.LimitRemaining != 0 {
				t.Fatalf("the next request after 1,800 tokens used of 1,000: %v", st)
			}
			// In debt by about 800 tokens at 1,000 a minute: about 48 s.
			if s := st.GetDurationUntilReset().GetSeconds(); s < 40 || s > 50 {
				t.Errorf("the next request waits %d s, want the time until the debt is repaid (about 48 s)", s)
			}
			// A plain flood at the exhausted limit takes nothing: its
			// requests are denied, and the debt stays what the charges
			// made it.
			for range 100 {
				ask(tenant())
			}
			if s := ask(g.request()).GetDurationUntilReset().GetSeconds(); s < 40 || s > 50 {
				t.Errorf("after a flood of denied requests the limit waits %d s, want the same (about 48 s)", s)
			}
		})
	}
}

// slowBackend answers after a pause, as a far store does.
type slowBackend struct {
	backend.Backend
	pause time.Duration
}

func (s slowBackend) Decide(ctx context.Context, req *backend.Request) (backend.Decision, error) {
	select {
	case <-time.After(s.pause):
	case <-ctx.Done():
		return backend.Decision{}, ctx.Err()
	}
	return s.Backend.Decide(ctx, req)
}

// A charge is written even when Envoy stops waiting first: a store
// slower than Envoy's deadline still gets it, and the tenant's next
// request is denied; the caller is answered by its deadline all the same
// (by the failure policy: here, UNAVAILABLE), as Envoy Gateway's
// request-time costs need.
func TestChargeOutlivesEnvoysDeadline(t *testing.T) {
	be := memory.New(memory.Options{SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	c := serve(t, ratelimit.New(rules(t, chargeRules), slowBackend{be, 300 * time.Millisecond}, ratelimit.Options{}))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	start := time.Now()
	_, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlv3.RateLimitDescriptor{withHits(tenant(), 1500)}})
	took := time.Since(start)
	cancel()
	if code := status.Code(err); code != codes.Unavailable {
		t.Fatalf("a charge behind a store slower than the deadline: %v, want the failure policy's UNAVAILABLE", err)
	}
	if took > 250*time.Millisecond {
		t.Errorf("answered after %v with a 100 ms deadline", took)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := call(t, c, &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlv3.RateLimitDescriptor{withHits(tenant(), 0)}}).Statuses[0]
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after a charge of 1,500 on a limit of 1,000, a check is still %v", st)
		}
	}
}

// landing counts the charges its backend has finished writing.
type landing struct {
	backend.Backend
	landed *atomic.Int32
}

func (l landing) Decide(ctx context.Context, req *backend.Request) (backend.Decision, error) {
	d, err := l.Backend.Decide(ctx, req)
	if req.Charge && err == nil {
		l.landed.Add(1)
	}
	return d, err
}

// On shutdown a charge that Envoy has stopped waiting for is still
// written before the backend closes: Settle waits for it, and says how
// many were still on their way when it cannot wait longer.
func TestSettleWaitsForChargesInFlight(t *testing.T) {
	be := memory.New(memory.Options{SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	var landed atomic.Int32
	svc := ratelimit.New(rules(t, chargeRules), slowBackend{landing{be, &landed}, 500 * time.Millisecond}, ratelimit.Options{})
	c := serve(t, svc)
	charge := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlv3.RateLimitDescriptor{withHits(tenant(), 1500)}})
	}

	charge()
	if n := landed.Load(); n != 0 {
		t.Fatalf("%d charges landed by their caller's deadline, before the store's 500 ms: the test shows nothing", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err := svc.Settle(ctx)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "1 charges still being written") {
		t.Errorf("Settle cut short with a charge on its way: %v, want it counted", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := svc.Settle(ctx); err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if n := landed.Load(); n != 1 {
		t.Fatalf("after Settle, %d charges landed, want 1", n)
	}
	// The Service is as it was: another charge goes on past its caller.
	charge()
	if err := svc.Settle(ctx); err != nil || landed.Load() != 2 {
		t.Fatalf("a second charge and Settle: %v, %d landed, want 2", err, landed.Load())
	}
}
