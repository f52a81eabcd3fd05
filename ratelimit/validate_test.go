package ratelimit_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/ratelimit"
)

// inputLimitCases build, for each input limit, a request that carries n of
// what the limit counts.
var inputLimitCases = []struct {
	name  string // as the message names the limit
	limit func(ratelimit.InputLimits) int
	req   func(n int) *rlsv3.RateLimitRequest
	what  string // the message's account of a request of n, before the limit
}{
	{"max-descriptors", func(l ratelimit.InputLimits) int { return l.MaxDescriptors }, func(n int) *rlsv3.RateLimitRequest {
		r := &rlsv3.RateLimitRequest{Domain: "test"}
		for range n {
			r.Descriptors = append(r.Descriptors, desc("unl", "x"))
		}
		return r
	}, "request has %d descriptors"},
	{"max-entries", func(l ratelimit.InputLimits) int { return l.MaxEntries }, func(n int) *rlsv3.RateLimitRequest {
		d := &rlv3.RateLimitDescriptor{}
		for i := range n {
			d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: fmt.Sprint("k", i), Value: "v"})
		}
		return &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlv3.RateLimitDescriptor{d}}
	}, "descriptor 0 has %d entries"},
	{"max-key-bytes", func(l ratelimit.InputLimits) int { return l.MaxKeyLen }, func(n int) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlv3.RateLimitDescriptor{desc("unl", "x"), desc(strings.Repeat("k", n), "v")}}
	}, "descriptor 1 entry 0: key is %d bytes"},
	{"max-key-bytes", func(l ratelimit.InputLimits) int { return l.MaxKeyLen }, func(n int) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: strings.Repeat("d", n), Descriptors: []*rlv3.RateLimitDescriptor{desc("unl", "x")}}
	}, "domain is %d bytes"},
	{"max-value-bytes", func(l ratelimit.InputLimits) int { return l.MaxValueLen }, func(n int) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlv3.RateLimitDescriptor{desc("unl", strings.Repeat("v", n))}}
	}, "descriptor 0 entry 0 (unl): value is %d bytes"},
}

// Each input limit admits a request that reaches it and refuses one past
// it with INVALID_ARGUMENT that names the limit and both numbers: with the
// defaults, and with limits set lower and higher than the defaults.
func TestInputLimits(t *testing.T) {
	def := ratelimit.DefaultInputLimits()
	if def != (ratelimit.InputLimits{MaxDescriptors: 64, MaxEntries: 32, MaxKeyLen: 256, MaxValueLen: 4096}) {
		t.Fatalf("DefaultInputLimits() = %+v; README.md documents 64, 32, 256 and 4096", def)
	}
	for _, tc := range []struct {
		name   string
		set    ratelimit.InputLimits // as given in Options
		limits ratelimit.InputLimits // in force
	}{
		{"defaults", ratelimit.InputLimits{}, def},
		{"lower", ratelimit.InputLimits{MaxDescriptors: 2, MaxEntries: 1, MaxKeyLen: 8, MaxValueLen: 3}, ratelimit.InputLimits{MaxDescriptors: 2, MaxEntries: 1, MaxKeyLen: 8, MaxValueLen: 3}},
		{"higher", ratelimit.InputLimits{MaxDescriptors: 100, MaxEntries: 40, MaxKeyLen: 300, MaxValueLen: 5000}, ratelimit.InputLimits{MaxDescriptors: 100, MaxEntries: 40, MaxKeyLen: 300, MaxValueLen: 5000}},
		{"one set, the rest default", ratelimit.InputLimits{MaxEntries: 3}, ratelimit.InputLimits{MaxDescriptors: 64, MaxEntries: 3, MaxKeyLen: 256, MaxValueLen: 4096}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := newService(t, ratelimit.Options{Input: tc.set})
			for _, lc := range inputLimitCases {
				n := lc.limit(tc.limits)
				if _, err := c.ShouldRateLimit(context.Background(), lc.req(n)); err != nil {
					t.Errorf("%s: a request at the limit (%d) refused: %v", lc.name, n, err)
				}
				_, err := c.ShouldRateLimit(context.Background(), lc.req(n+1))
				want := fmt.Sprintf(lc.what+", over the limit of %d (%s)", n+1, n, lc.name)
				if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != want {
					t.Errorf("%s: one past the limit: %v; want INVALID_ARGUMENT %q", lc.name, err, want)
				}
			}
		})
	}
}
