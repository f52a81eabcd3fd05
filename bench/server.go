// Package bench measures Sluice's ShouldRateLimit: against a do-nothing
// baseline on the same gRPC stack, or as a running fleet of replicas
// does it, with what it costs the backend. It holds the pieces the
// benchmarks of this package and the sluice-bench command share: the
// baseline server, a loopback gRPC server for any RateLimitService, a
// Sluice service on the memory or the Redis backend with the benchmark
// rules, a closed-loop load driver over one or more targets, and a reader
// of Sluice's /metrics that turns the counters' change over a run into
// backend calls (DynamoDB calls and capacity, Redis round trips) per
// decision.
//
// The point of the baseline is to subtract what is not Sluice: both sides
// are registered with ratelimit.Register on a default grpc.Server, so they
// share the transport, the codec and the decode path, and only the work
// behind ShouldRateLimit differs.
package bench

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/rueidis"
	"google.golang.org/grpc"

	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/backend/redis"
	"github.com/sluice-rl/sluice/descriptors"
	"github.com/sluice-rl/sluice/ratelimit"
	"github.com/sluice-rl/sluice/telemetry"
)

// Domain and the keys name the domain and descriptor keys of RulesYAML.
const (
	Domain = "bench"
	// Key has a limit so high that no run exhausts it.
	Key = "bench_key"
	// OverKey has a limit of one call an hour: the over-limit descriptor.
	OverKey = "bench_over"
	// HotKey has a finite limit, 2000/s, for accuracy runs.
	HotKey = "bench_hot"
	// FarKey has a finite limit, 500/s, for the at-limit run with the
	// store far away (matrix.sh's far-limit).
	FarKey = "bench_far"
)

// RulesYAML is the mapping config the benchmarks load, and the file
// bench/fleet.sh serves, embedded so that the two cannot drift apart. Its
// rule for Key takes any value (one bucket per value) with a limit so
// high that no benchmark exhausts it: every request goes through the
// whole decision path (match, resolve, bucket arithmetic, a limited
// status) and is allowed, so the measurement is not of the cheaper denial
// path. OverKey and HotKey are for the over-limit and accuracy runs.
//
//go:embed rules/bench.yaml
var RulesYAML string

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

// MemoryService is a Sluice service on the memory backend, with what
// `sluice serve` puts around it.
type MemoryService struct {
	Service *ratelimit.Service
	// ServerOptions are the gRPC server options serve adds.
	ServerOptions []grpc.ServerOption
	// Metrics serves the service's metrics in the Prometheus text format,
	// as /metrics on serve's --http-addr does.
	Metrics http.Handler
	release func()
}

// Close frees the backend and the telemetry.
func (m *MemoryService) Close() { m.release() }

// NewMemoryService returns the Sluice service `sluice serve` builds on the
// memory backend: rulesYAML (one file's content), a fresh backend made
// with opts, and telemetry as serve has it by default (metrics on, no
// traces, as without --otlp-endpoint). serve's admission and panic
// recovery interceptors are not among ServerOptions.
func NewMemoryService(rulesYAML string, opts memory.Options) (*MemoryService, error) {
	return NewMemoryServiceWith(rulesYAML, opts, telemetry.Options{TraceSampling: 0.01})
}

// NewMemoryServiceWith is NewMemoryService with telemetry made with tel.
func NewMemoryServiceWith(rulesYAML string, opts memory.Options, tel telemetry.Options) (*MemoryService, error) {
	cfg, err := descriptors.Parse(map[string][]byte{"bench.yaml": []byte(rulesYAML)})
	if err != nil {
		return nil, fmt.Errorf("parse benchmark rules: %w", err)
	}
	return newMemoryService(cfg, opts, tel)
}

func newMemoryService(cfg *descriptors.Config, opts memory.Options, telOpts telemetry.Options) (*MemoryService, error) {
	tel, err := telemetry.New(context.Background(), telOpts)
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	opts.OnBucketWrite = tel.BucketWritten
	be := memory.New(opts)
	return &MemoryService{
		Service:       ratelimit.New(staticRules{cfg}, tel.Backend("memory", be), ratelimit.Options{Observer: tel}),
		ServerOptions: tel.GRPCServerOptions(),
		Metrics:       tel.MetricsHandler(),
		release: func() {
			_ = be.Close()
			_ = tel.Shutdown(context.Background())
		},
	}, nil
}

// RedisService is a Sluice service on the Redis backend, built as
// `sluice serve --backend redis` builds it: the backend's round trips
// timed as operations "EVALSHA" and "HGETALL" of backend "redis", and its
// config cache counted, on Metrics.
type RedisService struct {
	Service       *ratelimit.Service
	ServerOptions []grpc.ServerOption
	Metrics       http.Handler
	// Backend is the Redis backend, for its Stats.
	Backend *redis.Backend
	release func()
}

// Close frees the backend and the telemetry. It does not close the
// client, which belongs to the caller.
func (r *RedisService) Close() { r.release() }

// NewRedisService returns the Sluice service `sluice serve` builds on the
// Redis backend: rulesYAML (one file's content), a backend on client made
// with opts (whose Call and OnBucketWrite are the telemetry's), and
// telemetry as NewMemoryService has it, so that the two services differ
// only in where the buckets are.
func NewRedisService(rulesYAML string, client rueidis.Client, opts redis.Options) (*RedisService, error) {
	cfg, err := descriptors.Parse(map[string][]byte{"bench.yaml": []byte(rulesYAML)})
	if err != nil {
		return nil, fmt.Errorf("parse benchmark rules: %w", err)
	}
	tel, err := telemetry.New(context.Background(), telemetry.Options{TraceSampling: 0.01})
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	opts.OnBucketWrite, opts.Call = tel.BucketWritten, tel.RedisCall
	be, err := redis.New(client, opts)
	if err != nil {
		_ = tel.Shutdown(context.Background())
		return nil, err
	}
	if err := tel.ObserveRedis(be); err != nil {
		_ = be.Close()
		_ = tel.Shutdown(context.Background())
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	return &RedisService{
		Service:       ratelimit.New(staticRules{cfg}, tel.Backend("redis", be), ratelimit.Options{Observer: tel}),
		ServerOptions: tel.GRPCServerOptions(),
		Metrics:       tel.MetricsHandler(),
		Backend:       be,
		release: func() {
			_ = be.Close()
			_ = tel.Shutdown(context.Background())
		},
	}, nil
}
