package ratelimit_test

import (
	"fmt"
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
	c, clk, berlin := atNoonFeb28InBerlin(t, ratelimit.Options{}, `
domain: test
descriptors:
  - key: tenant
    limits:
      - {name: rpm, rate: 20/min, cost: request}
      - {name: tpm, rate: 60000/min}
      - {name: month, rate: 1000, period: month, zone: Europe/Berlin}
`)
	ask := func(hits uint32) *rlsv3.RateLimitResponse_DescriptorStatus {
		return call(t, c, &rlsv3.RateLimitRequest{HitsAddend: hits, Descriptors: []*rlv3.RateLimitDescriptor{desc("tenant", "acme")}}).Statuses[0]
	}
	const month = rlsv3.RateLimitResponse_RateLimit_MONTH
	check(t, "600 of a month's 1000", ask(600), want{rlsv3.RateLimitResponse_OK, 1000, month, "month", 400, 12 * 3600})
	check(t, "500 more", ask(500), want{rlsv3.RateLimitResponse_OVER_LIMIT, 1000, month, "month", 400, 12 * 3600})
	clk.ms.Store(time.Date(2026, 3, 1, 0, 0, 0, 0, berlin).UnixMilli())
	check(t, "500 on March 1st", ask(500), want{rlsv3.RateLimitResponse_OK, 1000, month, "month", 500, (31*24 - 1) * 3600})
}

// The headers a client backs off by, in debt and on a budget: the limit a
// charge put below zero comes first with r=0 and t the seconds until it
// is above zero again; a budget's item gives its amount per its nominal
// period (w: a month is 30 days) and t the exact seconds to its boundary;
// a budget in debt waits for the boundary that repays it.
func TestHeadersInDebtAndOnABudget(t *testing.T) {
	c, clk, berlin := atNoonFeb28InBerlin(t, ratelimit.Options{ResponseHeaders: true}, `
domain: test
descriptors:
  - key: tenant
    limits:
      - {name: rpm, rate: 20/min, cost: request}
      - {name: tpm, rate: 1000/min}
      - {name: month, rate: 100000, period: month, zone: Europe/Berlin}
  - key: plan
    limits:
      - {name: month, rate: 1000, period: month, zone: Europe/Berlin}
`)
	ask := func(d *rlv3.RateLimitDescriptor) map[string]string {
		got := map[string]string{}
		for _, h := range call(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{d}}).ResponseHeadersToAdd {
			got[h.Key] = h.Value
		}
		return got
	}
	expect := func(what string, got map[string]string, want map[string]string) {
		t.Helper()
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %s %q, want %q", what, k, got[k], v)
			}
		}
	}
	const toMarch = 12 * 3600 // noon on February 28th to midnight in Berlin
	expect("a check", ask(withHits(desc("tenant", "acme"), 0)), map[string]string{
		"RateLimit-Policy": `"rpm";q=20;w=60, "tpm";q=1000;w=60, "month";q=100000;w=2592000`,
	})
	ask(withHits(desc("tenant", "acme"), 1500)) // the response used 1,500 tokens: tpm 500 below zero, month 98,500 left
	expect("a check with tpm in debt", ask(withHits(desc("tenant", "acme"), 0)), map[string]string{
		// 500 tokens at 1,000 a minute take 30 s to repay, and the
		// first millitoken above zero the 31st second; rpm paid one for
		// the first check (the charge and the denial take none), 3 s of
		// refill at 20 a minute.
		"RateLimit":           fmt.Sprintf(`"tpm";r=0;t=31, "rpm";r=19;t=3, "month";r=98500;t=%d`, toMarch),
		"RateLimit-Remaining": "0",
		"RateLimit-Reset":     "31",
	})

	ask(withHits(desc("plan", "acme"), 1500)) // 500 below a budget of 1,000
	expect("a check with the budget in debt", ask(withHits(desc("plan", "acme"), 0)), map[string]string{
		"RateLimit-Policy":    `"month";q=1000;w=2592000`,
		"RateLimit":           fmt.Sprintf(`"month";r=0;t=%d`, toMarch),
		"RateLimit-Remaining": "0",
		"RateLimit-Reset":     fmt.Sprint(toMarch),
	})
	// March repays the debt: 500 of 1,000 left, all of March to go (31
	// days less the hour daylight saving takes).
	clk.ms.Store(time.Date(2026, 3, 1, 0, 0, 0, 0, berlin).UnixMilli())
	expect("a check on March 1st", ask(withHits(desc("plan", "acme"), 0)), map[string]string{
		"RateLimit":           fmt.Sprintf(`"month";r=500;t=%d`, (31*24-1)*3600),
		"RateLimit-Remaining": "500",
	})
}

// atNoonFeb28InBerlin serves rulesYAML with opts on the memory backend,
// on a clock set at noon on 2026-02-28 in Berlin (the day before a
// month's boundary, whose March loses an hour), and returns the client,
// the clock and the zone.
func atNoonFeb28InBerlin(t *testing.T, opts ratelimit.Options, rulesYAML string) (rlsv3.RateLimitServiceClient, *clock, *time.Location) {
	t.Helper()
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{}
	clk.ms.Store(time.Date(2026, 2, 28, 12, 0, 0, 0, berlin).UnixMilli())
	be := memory.New(memory.Options{Now: clk.now, SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	return serve(t, ratelimit.New(rules(t, rulesYAML), be, opts)), clk, berlin
}
