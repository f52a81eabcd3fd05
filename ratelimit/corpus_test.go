package ratelimit_test

import (
	"math"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/descriptors"
	"github.com/sluice-rl/sluice/descriptors/corpustest"
	"github.com/sluice-rl/sluice/ratelimit"
)

// One running Sluice per rule file of the shared corpus, asked over gRPC
// every case of envoyproxy/ratelimit's own config tests that a single
// file answers: the answer carries the limit that service selects (its
// rate, unit and name), no limit where it has none, and an unlimited
// rule's unlimited remaining count. The requests only check (hits 0), so
// every case sees the rules as loaded. descriptors' corpus tests hold the
// rest of the match (stats keys, metadata) to the same cases.
func TestCorpusAnswersAsEnvoyproxyDoes(t *testing.T) {
	dir := corpustest.Dir(t)
	clients := map[string]rlsv3.RateLimitServiceClient{}
	client := func(file string) rlsv3.RateLimitServiceClient {
		if c, ok := clients[file]; ok {
			return c
		}
		cfg, err := descriptors.Parse(corpustest.Read(t, dir, file))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		be := memory.New(memory.Options{SweepInterval: -1})
		t.Cleanup(func() { be.Close() })
		c := serve(t, ratelimit.New(staticRules{cfg}, be, ratelimit.Options{}))
		clients[file] = c
		return c
	}
	asked := 0
	for _, c := range corpustest.Cases(t, dir) {
		result := c.Expect["result"]
		if len(c.Load) > 1 || (result != "limit" && result != "no_limit") {
			continue // merged domains; load errors are descriptors' to check
		}
		d := c.Descriptor()
		if len(d.Entries) == 0 {
			continue // Envoy never sends a descriptor without entries; Sluice refuses one as invalid
		}
		resp, err := client(c.File).ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{
			Domain: c.Domain, Descriptors: []*rlv3.RateLimitDescriptor{d}, HitsAddend: 0})
		if err != nil {
			t.Errorf("%v: %v", c, err)
			continue
		}
		asked++
		st := resp.Statuses[0]
		switch {
		case result == "no_limit":
			if st.CurrentLimit != nil || st.Code != rlsv3.RateLimitResponse_OK {
				t.Errorf("%v: no limit in envoyproxy/ratelimit; Sluice answered %v", c, st)
			}
		case c.Expect["unlimited"] == true:
			if st.LimitRemaining != math.MaxUint32 || st.Code != rlsv3.RateLimitResponse_OK {
				t.Errorf("%v: unlimited in envoyproxy/ratelimit; Sluice answered %v", c, st)
			}
		case st.CurrentLimit == nil:
			t.Errorf("%v: a limit in envoyproxy/ratelimit; Sluice answered none: %v", c, st)
		default:
			l := st.CurrentLimit
			if want, ok := c.Expect["requests_per_unit"].(float64); ok && float64(l.RequestsPerUnit) != want {
				t.Errorf("%v: requests_per_unit %v in envoyproxy/ratelimit, %d in Sluice's answer", c, want, l.RequestsPerUnit)
			}
			if want, ok := c.Expect["unit"].(string); ok && l.Unit.String() != want {
				t.Errorf("%v: unit %v in envoyproxy/ratelimit, %v in Sluice's answer", c, want, l.Unit)
			}
			if want, ok := c.Expect["name"].(string); ok && l.Name != want {
				t.Errorf("%v: name %q in envoyproxy/ratelimit, %q in Sluice's answer", c, want, l.Name)
			}
		}
	}
	t.Logf("%d cases asked over gRPC, of %d files", asked, len(clients))
	if asked < 80 {
		t.Errorf("only %d cases asked", asked)
	}
}
