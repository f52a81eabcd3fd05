// Package bench measures Sluice's ShouldRateLimit against a do-nothing
// baseline on the same gRPC stack. It holds the pieces the benchmarks of
// this package and the sluice-bench command share: the baseline server, a
// loopback gRPC server for any RateLimitService, a Sluice service on the
// memory backend with a benchmark config, and a closed-loop load driver.
//
// The point of the baseline is to subtract what is not Sluice: both sides
// are registered with ratelimit.Register on a default grpc.Server, so they
// share the transport, the codec and the decode path, and only the work
// behind ShouldRateLimit differs.
package bench

import (
	"context"
	"errors"
	"fmt"
	"net"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/descriptors"
	"github.com/sluice-rl/sluice/ratelimit"
	"github.com/sluice-rl/sluice/telemetry"
)

// Domain and Key name the domain and descriptor key of RulesYAML.
const (
	Domain = "bench"
	Key    = "bench_key"
)

// RulesYAML is the mapping config the benchmarks load. Its one rule takes
// any value of bench_key (one bucket per value) with a limit so high that
// no benchmark exhausts it: every request goes through the whole decision
// path (match, resolve, bucket arithmetic, a limited status) and is
// allowed, so the measurement is not of the cheaper denial path.
const RulesYAML = `domain: bench
descriptors:
  - key: bench_key
    limits:
      - name: bench
        rate: 1000000000/s
`

// NoopServer is the do-nothing baseline: it answers OK with one OK status
// per descriptor and does nothing else. It builds the same response shape
// Envoy needs so that the baseline pays for the same allocations and
// encoding a minimal real answer would.
type NoopServer struct{}

// ShouldRateLimit implements rlsv3.RateLimitServiceServer.
func (NoopServer) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	statuses := make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors()))
	for i := range statuses {
		statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: statuses}, nil
}

// Serve starts a gRPC server on 127.0.0.1:0 serving svc through
// ratelimit.Register, the registration `sluice serve` uses, so that any
// two services served here differ only in svc. It returns the address
// and a stop func that closes the server and its connections at once
// (in-flight calls fail) and reports how serving ended.
func Serve(svc rlsv3.RateLimitServiceServer, opts ...grpc.ServerOption) (addr string, stop func() error, err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("listen on loopback: %w", err)
	}
	srv := grpc.NewServer(opts...)
	ratelimit.Register(srv, svc)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	stop = func() error {
		srv.Stop()
		if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("serve %s: %w", ln.Addr(), err)
		}
		return nil
	}
	return ln.Addr().String(), stop, nil
}

// staticRules is a ratelimit.Rules that never reloads.
type staticRules struct{ cfg *descriptors.Config }

func (r staticRules) Current() *descriptors.Config { return r.cfg }

// NewMemoryService returns a Sluice service as `sluice serve` builds it
// on the memory backend: rulesYAML (one file's content), a fresh backend
// made with opts, and telemetry as serve has it by default (metrics on,
// no traces, as without --otlp-endpoint), with the gRPC server options serve
// adds. release frees the backend and the telemetry.
func NewMemoryService(rulesYAML string, opts memory.Options) (svc *ratelimit.Service, serverOpts []grpc.ServerOption, release func(), err error) {
	cfg, err := descriptors.Parse(map[string][]byte{"bench.yaml": []byte(rulesYAML)})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("parse benchmark rules: %w", err)
	}
	tel, err := telemetry.New(context.Background(), telemetry.Options{TraceSampling: 0.01})
	if err != nil {
		return nil, nil, nil, err
	}
	opts.OnBucketWrite = tel.BucketWritten
	be := memory.New(opts)
	svc = ratelimit.New(staticRules{cfg}, tel.Backend("memory", be), ratelimit.Options{Observer: tel})
	release = func() {
		_ = be.Close()
		_ = tel.Shutdown(context.Background())
	}
	return svc, tel.GRPCServerOptions(), release, nil
}
