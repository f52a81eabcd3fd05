package rlqs_test

import (
	"context"
	"math"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/descriptors"
	"github.com/sluice-rl/sluice/rlqs"
	"github.com/sluice-rl/sluice/rlqs/rlqstest"
)

// serveWith is a quota service with opts over a memory backend on a
// loopback port, and a connection to it.
func serveWith(t *testing.T, opts rlqs.Options, dial ...grpc.DialOption) (*rlqs.Service, *grpc.ClientConn) {
	t.Helper()
	be := memory.New(memory.Options{})
	t.Cleanup(func() { be.Close() })
	return replica(t, rules(t, 1000), be, opts, dial...)
}

func usage(id map[string]string, elapsed time.Duration, allowed, denied uint64) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: id},
		TimeElapsed: durationpb.New(elapsed), NumRequestsAllowed: allowed, NumRequestsDenied: denied}
}

// Bad reports are refused one by one and counted, and leave the stream
// serving the good ones; nothing they say makes an assignment admit more
// than the limit.
func TestBadReportsAreRefusedAndCounted(t *testing.T) {
	svc, conn := serveWith(t, rlqs.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	good := map[string]string{"api": "search"}
	bad := []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage(map[string]string{}, 0, 1, 0),                                    // empty id
		usage(map[string]string{"api": strings.Repeat("x", 1<<20)}, 0, 1, 0),   // a 1 MiB value
		usage(map[string]string{strings.Repeat("k", 300): "v"}, 0, 1, 0),       // a key over 256 bytes
		usage(map[string]string{"api": "a"}, -time.Second, 1, 0),               // negative time
		usage(map[string]string{"api": "b"}, time.Second, math.MaxUint64, 0),   // 2^64-1 allowed
		usage(map[string]string{"api": "c"}, time.Second, 0, math.MaxUint64-1), // absurd denied
	}
	msg := &rlqsv3.RateLimitQuotaUsageReports{Domain: "quota",
		BucketQuotaUsages: append(bad, usage(good, 0, 1, 0))}
	if err := stream.Send(msg); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var sent []string
	for _, a := range resp.GetBucketAction() {
		sent = append(sent, a.GetBucketId().String())
		tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
		if tb.GetTokensPerFill().GetValue() > 1000 || tb.GetMaxTokens() > 1000 {
			t.Errorf("assignment over the limit: %v", a)
		}
	}
	if len(sent) != 1 || !strings.Contains(sent[0], "search") {
		t.Errorf("assignments for %v, want only the good bucket", sent)
	}
	if got := svc.Stats().Refused; got != uint64(len(bad)) {
		t.Errorf("%d reports refused, want %d", got, len(bad))
	}
	// A report of 0 time elapsed after the first changes nothing.
	if err := stream.Send(&rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(good, 0, 5, 5)}}); err != nil {
		t.Fatal(err)
	}
	// Another domain on the same stream ends it.
	if err := stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "other", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(good, 0, 1, 0)}}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err = stream.Recv(); err != nil {
			break
		}
	}
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "domain") {
		t.Errorf("a second domain: %v, want INVALID_ARGUMENT naming the domain", err)
	}
}

// A stream whose first report names no domain is refused; one for a
// domain no file defines is served, its buckets allowed everything (as
// ShouldRateLimit answers OK to what no rule matches), and counted.
func TestDomains(t *testing.T) {
	_, conn := serveWith(t, rlqs.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := rlqsv3.NewRateLimitQuotaServiceClient(conn)

	stream, err := client.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(&rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"api": "x"}, 0, 1, 0)}})
	if _, err := stream.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no domain: %v, want INVALID_ARGUMENT", err)
	}

	stream, err = client.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "nowhere", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"api": "x"}, 0, 1, 0)}})
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if s := resp.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy(); s.GetTokenBucket() != nil || s.GetBlanketRule() != 0 {
		t.Errorf("unknown domain: %v, want ALLOW_ALL", s)
	}
}

// 100,000 bucket ids on one stream: those past the stream's limit are
// refused and counted, and memory stays bounded; 100 streams of 100
// buckets each fit in a stated number of bytes per bucket.
func TestBucketsInBoundedMemory(t *testing.T) {
	const maxBuckets = 1000
	svc, conn := serveWith(t, rlqs.Options{MaxBuckets: maxBuckets})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client := rlqsv3.NewRateLimitQuotaServiceClient(conn)

	stream, err := client.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var many []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
	for i := range 100_000 {
		many = append(many, usage(map[string]string{"api": "a" + strconv.Itoa(i)}, 0, 1, 0))
	}
	if err := stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: many}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() bool { return svc.Stats().Refused == 100_000-maxBuckets })
	if got := svc.Stats().Buckets; got != maxBuckets {
		t.Errorf("%d buckets held, want %d", got, maxBuckets)
	}
	cancel()
	eventually(t, 10*time.Second, func() bool { return svc.Stats().Streams == 0 && svc.Stats().Buckets == 0 })

	// 100 streams of 100 buckets, each assigned: the heap they add.
	ctx, cancel = context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	before := heap()
	var streams []rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	for s := range 100 {
		stream, err := client.StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "quota"}
		for b := range 100 {
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, usage(map[string]string{"api": "s" + strconv.Itoa(s) + "-" + strconv.Itoa(b)}, 0, 1, 0))
		}
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
		streams = append(streams, stream)
	}
	for _, stream := range streams {
		for got := 0; got < 100; {
			resp, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			got += len(resp.GetBucketAction())
		}
	}
	if got := svc.Stats().Buckets; got != 10_000 {
		t.Fatalf("%d buckets, want 10,000", got)
	}
	per := (heap() - before) / 10_000
	t.Logf("10,000 buckets on 100 streams: %d bytes of heap per bucket (the memory backend's bucket included)", per)
	if per > 8<<10 {
		t.Errorf("%d bytes per bucket, want at most 8 KiB", per)
	}
}

// A client that never reads its responses has its stream ended once one
// response has waited StallTimeout, and what its buckets held is counted
// as stranded.
func TestStreamThatNeverReads(t *testing.T) {
	// A fixed 64 KiB window: gRPC would otherwise grow it to take in
	// megabytes the application never reads.
	svc, conn := serveWith(t, rlqs.Options{StallTimeout: 2 * time.Second},
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Enough buckets that their assignments fill the window gRPC buffers.
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "quota"}
	for b := range 5000 {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, usage(map[string]string{"api": strings.Repeat("v", 200) + strconv.Itoa(b)}, 0, 1, 0))
	}
	go func() {
		for range 20 {
			if err := stream.Send(m); err != nil {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	eventually(t, 10*time.Second, func() bool { return svc.Stats().Buckets > 0 })
	eventually(t, 20*time.Second, func() bool { return svc.Stats().Streams == 0 })
	took := time.Since(start)
	t.Logf("the stream ended %v after it began", took.Round(100*time.Millisecond))
	if took < 2*time.Second {
		t.Errorf("the stream ended after %v, before its stall timeout", took)
	}
	if svc.Stats().Stranded == 0 {
		t.Errorf("the stalled stream's tokens were not counted stranded: %+v", svc.Stats())
	}
}

func heap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

func eventually(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v", d)
		}
	}
}

// More streams than MaxStreams: the one too many is refused with
// RESOURCE_EXHAUSTED, and a stream that ends makes room; Drain ends the
// rest with UNAVAILABLE.
func TestStreamLimitAndDrain(t *testing.T) {
	svc, conn := serveWith(t, rlqs.Options{MaxStreams: 1})
	client := rlqsv3.NewRateLimitQuotaServiceClient(conn)
	open := func(ctx context.Context) (rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, error) {
		stream, err := client.StreamRateLimitQuotas(ctx)
		if err != nil {
			return nil, err
		}
		// A stream the server has already ended fails Send with io.EOF;
		// Recv says why.
		_ = stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "quota",
			BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"api": "x"}, 0, 1, 0)}})
		_, err = stream.Recv()
		return stream, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := open(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := open(context.Background()); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a second stream: %v, want RESOURCE_EXHAUSTED", err)
	}
	cancel()
	eventually(t, 5*time.Second, func() bool { return svc.Stats().Streams == 0 })
	stream, err := open(context.Background())
	if err != nil {
		t.Fatalf("a stream after the first ended: %v", err)
	}
	svc.Drain()
	for err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("after Drain: %v, want UNAVAILABLE", err)
	}
}

// A rule with a per_request limit (cost: request) is assigned DENY_ALL:
// one take of n tokens is one decision, which such a limit would charge
// one token, so no token bucket could be paid for honestly.
func TestPerRequestLimitIsDenied(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"q.yaml": []byte(`
domain: quota
descriptors:
  - key: api
    limits:
      - {name: tokens, rate: 1000/s}
      - {name: rpm, rate: 100/s, cost: request}
`)})
	if err != nil {
		t.Fatal(err)
	}
	be := memory.New(memory.Options{})
	t.Cleanup(func() { be.Close() })
	_, conn := replica(t, rlqstest.Rules{Config: cfg}, be, rlqs.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "quota",
		BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"api": "x"}, 0, 1, 0)}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if s := resp.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy(); s.GetBlanketRule() != 1 {
		t.Errorf("a per_request limit's bucket got %v, want DENY_ALL", s)
	}
}
