package regions

import (
	"testing"

	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/bucket/period"
)

func TestAsked(t *testing.T) {
	rps := bucket.Limit{Name: "rps", Amount: 400_000, Period: 1_000, Burst: 400_000}
	tpm := bucket.Limit{Name: "tpm", Amount: 60_000_000, Period: 60_000, Burst: 60_000_000}
	perReq := bucket.Limit{Name: "rpm", Amount: 600_000, Period: 60_000, Burst: 600_000, PerRequest: true}
	// 100,000 tokens a month: a request of 100 asks more of it than of
	// tpm, but a budget's part does not follow demand.
	month := bucket.Limit{Name: "month", Amount: 100_000_000, Period: 30 * 86_400_000, Burst: 100_000_000, Calendar: period.Month}
	for _, c := range []struct {
		name   string
		limits []bucket.Limit
		hits   int64
		window int64
		want   float64
	}{
		// 1 of 400/s over 10 s: 1/4000 of the limit.
		{"a hit", []bucket.Limit{rps}, 1, 10_000, 250},
		{"hits", []bucket.Limit{rps}, 40, 10_000, 10_000},
		// The window's whole rate.
		{"the whole limit", []bucket.Limit{rps}, 4_000, 10_000, Total},
		// 1,000 tokens a second over 10 s against 400/s and 1,000/s: the
		// first is asked for more of itself.
		{"the limit asked the most of", []bucket.Limit{tpm, rps}, 100, 10_000, 25_000},
		// A request of 1,000 hits is one request of a per-request limit
		// (10/s: 1/100 of it over 10 s), and 1,000 tokens of 1,000/s.
		{"per request", []bucket.Limit{perReq}, 1_000, 10_000, 10_000},
		{"per request beside tokens", []bucket.Limit{perReq, tpm}, 1_000, 10_000, 100_000},
		{"no hits", []bucket.Limit{rps}, 0, 10_000, 0},
		{"a budget beside a rate", []bucket.Limit{month, tpm}, 100, 10_000, 10_000},
		{"a budget alone", []bucket.Limit{month}, 100, 10_000, 0},
		{"a limit that refills nothing", []bucket.Limit{{Name: "x", Period: 1_000}}, 1, 10_000, 100 * Total},
		{"far past the limit", []bucket.Limit{rps}, 1 << 40, 10_000, 100 * Total},
		{"no limits", nil, 5, 10_000, 0},
	} {
		if got := Asked(c.limits, c.hits, c.window); got != c.want {
			t.Errorf("%s: Asked = %v, want %v", c.name, got, c.want)
		}
	}
}
