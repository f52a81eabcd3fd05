package ratelimit_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/ratelimit"
)

// FuzzShouldRateLimit feeds arbitrary descriptors to the service: every
// call must end in an answer with one status per descriptor, or in
// INVALID_ARGUMENT, and never in a panic.
func FuzzShouldRateLimit(f *testing.F) {
	f.Add("test", "ip", "10.0.0.1", "multi", "k", uint64(1), uint32(0), false)
	f.Add("test", "multi", "", "a", "x", uint64(0), uint32(7), true)
	f.Add("test", "slow", "a#b%c", "b", "y", uint64(1<<63), uint32(1<<31), false)
	f.Add("", "", "", "", "", uint64(0), uint32(0), false)
	f.Add("test", "blocked", "\x00", "unl", "*", ^uint64(0), ^uint32(0), true)
	f.Add(strings.Repeat("d", 257), "ip", "1", "k", "v", uint64(1), uint32(1), false)
	f.Add("test", strings.Repeat("k", 256), strings.Repeat("v", 4096), "ip", "1", uint64(1), uint32(1), false)
	f.Add("test", "ip", "1", strings.Repeat("k", 257), "v", uint64(1), uint32(1), false)
	f.Add("test", "ip", strings.Repeat("v", 4097), "k", "v", uint64(1), uint32(1), false)
	be := memory.New(memory.Options{SweepInterval: -1, MaxBuckets: 1000})
	defer be.Close()
	svc := ratelimit.New(rules(f, testRules), be, ratelimit.Options{ResponseHeaders: true})
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2 string, hits uint64, reqHits uint32, negative bool) {
		d1 := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: k1, Value: v1}}}
		d2 := &rlv3.RateLimitDescriptor{
			Entries:        []*rlv3.RateLimitDescriptor_Entry{{Key: k1, Value: v1}, {Key: k2, Value: v2}},
			HitsAddend:     wrapperspb.UInt64(hits),
			IsNegativeHits: negative,
		}
		req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: reqHits, Descriptors: []*rlv3.RateLimitDescriptor{d1, d2, desc(k2, v2)}}
		resp, err := svc.ShouldRateLimit(context.Background(), req)
		// The request is refused exactly when it breaks a documented rule:
		// a name missing, or over a default input limit.
		lim := ratelimit.DefaultInputLimits()
		valid := domain != "" && k1 != "" && k2 != "" && len(domain) <= lim.MaxKeyLen &&
			len(k1) <= lim.MaxKeyLen && len(k2) <= lim.MaxKeyLen && len(v1) <= lim.MaxValueLen && len(v2) <= lim.MaxValueLen
		if err != nil {
			if status.Code(err) != codes.InvalidArgument || valid {
				t.Fatalf("%v (the request is valid: %v)", err, valid)
			}
			return
		}
		if !valid {
			t.Fatalf("an invalid request answered: %v", resp)
		}
		if len(resp.Statuses) != 3 {
			t.Fatalf("%d statuses for 3 descriptors", len(resp.Statuses))
		}
	})
}

type panicking struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (panicking) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	panic("boom")
}

func TestRecoverPanicsKeepsServing(t *testing.T) {
	interceptor := ratelimit.RecoverPanics(slog.New(slog.DiscardHandler))
	info := &grpc.UnaryServerInfo{FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	_, err := interceptor(context.Background(), &rlsv3.RateLimitRequest{}, info, func(ctx context.Context, req any) (any, error) {
		return panicking{}.ShouldRateLimit(ctx, req.(*rlsv3.RateLimitRequest))
	})
	if status.Code(err) != codes.Internal {
		t.Fatalf("panic became %v, want INTERNAL", err)
	}
	resp, err := interceptor(context.Background(), &rlsv3.RateLimitRequest{}, info, func(context.Context, any) (any, error) {
		return &rlsv3.RateLimitResponse{}, nil
	})
	if err != nil || resp == nil {
		t.Fatalf("a normal call after a panic: %v %v", resp, err)
	}
}
