package ratelimit_test

import (
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/ratelimit"
)

// A budget beside rates in one descriptor: while it binds (the fewest
// tokens left for its size, or the one that denies), the answer names
// it per MONTH, and duration_until_reset is the time to midnight on the
// first of the next month in Berlin, exactly: 12 hours from noon on the
// last day of February, and all of March (31 days less the hour daylight
// saving takes) from its first instant.
func TestBudgetDurationUntilReset(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{}
	clk.ms.Store(time.Date(2026, 2, 28, 12, 0, 0, 0, berlin).UnixMilli())
	be := memory.New(memory.Options{Now: clk.now, SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	c := serve(t, ratelimit.New(rules(t, `
domain: test
descriptors:
  - key: tenant
    limits:
      - {name: rpm, rate: 20/min, cost: request}
      - {name: tpm, rate: 60000/min}
      - {name: month, rate: 1000, period: month, zone: Europe/Berlin}
`), be, ratelimit.Options{}))
	ask := func(hits uint32) *rlsv3.RateLimitResponse_DescriptorStatus {
		return call(t, c, &rlsv3.RateLimitRequest{HitsAddend: hits, Descriptors: []*rlv3.RateLimitDescriptor{desc("tenant", "acme")}}).Statuses[0]
	}
	const month = rlsv3.RateLimitResponse_RateLimit_MONTH
	check(t, "600 of a month's 1000", ask(600), want{rlsv3.RateLimitResponse_OK, 1000, month, "month", 400, 12 * 3600})
	check(t, "500 more", ask(500), want{rlsv3.RateLimitResponse_OVER_LIMIT, 1000, month, "month", 400, 12 * 3600})
	clk.ms.Store(time.Date(2026, 3, 1, 0, 0, 0, 0, berlin).UnixMilli())
	check(t, "500 on March 1st", ask(500), want{rlsv3.RateLimitResponse_OK, 1000, month, "month", 500, (31*24 - 1) * 3600})
}
