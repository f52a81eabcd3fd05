package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/sluice-rl/sluice/admission"
	"github.com/sluice-rl/sluice/backend"
	ddb "github.com/sluice-rl/sluice/backend/dynamodb"
	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/backend/redis"
	"github.com/sluice-rl/sluice/certs"
	"github.com/sluice-rl/sluice/ratelimit"
	"github.com/sluice-rl/sluice/rlqs"
	"github.com/sluice-rl/sluice/telemetry"
)

// serveOptions are the flags of `sluice serve`.
type serveOptions struct {
	grpcAddr, httpAddr, debugAddr string
	metricsAddr                   string
	ratelimitMetrics              bool
	configDir                     string
	xdsServer, xdsNodeID          string
	xdsCA, xdsCert, xdsKey        string
	xdsStartWithoutRules          bool
	backend                       string
	overrides                     string
	table, region, endpoint       string
	keyPrefix                     string
	redis                         redis.Conn
	onBackendError                string
	ttlMultiplier                 int64
	configCacheTTL                time.Duration
	coalesceWrites                bool
	denyStaleness                 time.Duration
	leaseHorizon                  time.Duration
	memoryMaxBuckets              int
	shadowMode                    bool
	quotaMode                     bool
	quotaGroupKeys                []string
	dynamicMetadata               bool
	responseHeaders               bool
	pprof                         bool
	global                        globalOptions
	shutdownTimeout               time.Duration
	logLevel, logFormat           string
	nearLimitRatio                float64
	otlpEndpoint                  string
	otlpInsecure                  bool
	traceSampling                 float64
	tlsCert, tlsKey, tlsClientCA  string
	input                         ratelimit.InputLimits
	overload                      admission.Limits
	rlqs                          rlqsOptions
	// spanExporter receives spans too, and decorate wraps the backend the
	// service calls; tests set them, they are no flags.
	spanExporter sdktrace.SpanExporter
	decorate     func(backend.Backend) backend.Backend
}

func newServeCommand() *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the rate-limit service",
		Long: `Run Sluice: Envoy's RateLimitService over gRPC, health and readiness over HTTP,
and the loaded rules on the debug address. Every flag can also be set by an
environment variable: --grpc-addr is SLUICE_GRPC_ADDR.`,
		Example: `  # the quick start: memory backend, example rules
  sluice serve --config-dir examples/config

  # a dry run in front of production traffic: decide and count, never deny
  sluice serve --shadow-mode`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(cmd.ErrOrStderr(), o.logLevel, o.logFormat)
			if err != nil {
				return err
			}
			s, err := startServer(cmd.Context(), o, log)
			if err != nil {
				return err
			}
			return s.wait(cmd.Context())
		},
	}
	o.register(cmd.Flags())
	return cmd
}

// register defines the flags of serve on f, each with its default, into
// o. Tests build their options the same way, so they start from the
// defaults an operator gets.
func (o *serveOptions) register(f *pflag.FlagSet) {
	f.StringVar(&o.grpcAddr, "grpc-addr", ":8081", "address of the gRPC RateLimitService and RateLimitQuotaService (and gRPC health, reflection)")
	f.StringVar(&o.httpAddr, "http-addr", ":8080", "address of /healthz and /readyz")
	f.StringVar(&o.metricsAddr, "metrics-addr", "", "serve /metrics on this address too, on its own listener (the HTTP address keeps it); empty: none")
	f.BoolVar(&o.ratelimitMetrics, "ratelimit-metrics", false, "also count every limited descriptor under envoyproxy/ratelimit's Prometheus names (ratelimit_service_rate_limit_*, labels domain, key1, key2), which dashboards built for it read")
	f.StringVar(&o.debugAddr, "debug-addr", "127.0.0.1:6070", "address of /debug/config (and pprof with --pprof); empty disables it")
	f.StringVar(&o.configDir, "config-dir", "examples/config", "directory of rule files (*.yaml), hot-reloaded; not read with --xds-server")
	f.StringVar(&o.xdsServer, "xds-server", "", "take the rules from this xDS server (host:port) instead of --config-dir: RateLimitConfig resources over ADS, as Envoy Gateway sends them")
	f.StringVar(&o.xdsNodeID, "xds-node-id", "", "the node ID this replica gives the xDS server; required with --xds-server")
	f.StringVar(&o.xdsCA, "xds-tls-ca", "", "connect to the xDS server with TLS, trusting this CA bundle (PEM)")
	f.StringVar(&o.xdsCert, "xds-tls-cert", "", "client certificate (PEM) for mutual TLS with the xDS server; needs --xds-tls-ca; with it, the three files are reloaded when they change")
	f.StringVar(&o.xdsKey, "xds-tls-key", "", "the key of --xds-tls-cert (PEM)")
	f.BoolVar(&o.xdsStartWithoutRules, "xds-start-without-rules", false, "serve at once, limiting nothing until the xDS server's first rules arrive, instead of waiting for them")
	f.StringVar(&o.backend, "backend", "memory", "where buckets live: memory, dynamodb or redis")
	f.StringVar(&o.overrides, "overrides", "", "memory backend: YAML file of entity, resource and system limits")
	f.StringVar(&o.table, "table", "", "dynamodb backend: the table (create it with sluice table create)")
	f.StringVar(&o.keyPrefix, "key-prefix", "", "dynamodb and redis backends: prefix of every key, to share a table or a Redis (redis: sluice when empty)")
	addDynamoDBFlags(f, &o.region, &o.endpoint)
	addRedisFlags(f, &o.redis)
	f.StringVar(&o.onBackendError, "on-backend-error", "error", "answer when the backend fails or is late: error (UNAVAILABLE), allow or deny")
	f.Int64Var(&o.ttlMultiplier, "ttl-multiplier", backend.DefaultTTLMultiplier, "idle buckets expire after this many times their time to fill; <= 0 never")
	f.DurationVar(&o.configCacheTTL, "config-cache-ttl", time.Minute, "dynamodb and redis backends: how long limits read from the store are reused; a change reaches the replica within this time")
	f.BoolVar(&o.coalesceWrites, "coalesce-writes", true, "dynamodb and redis backends: decisions for a bucket that arrive while its write is in flight are decided together and written as one (redis: decisions on any bucket that arrive while the script is in flight share its next run)")
	f.DurationVar(&o.denyStaleness, "deny-staleness", time.Second, "dynamodb backend: deny without calling DynamoDB from a bucket state seen at most this long ago; 0 turns it off")
	f.DurationVar(&o.leaseHorizon, "lease-horizon", ddb.DefaultLeaseHorizon, "dynamodb and redis backends: how long the tokens a replica leases from a bucket should last at its own demand (most decisions then need no call to the store); 0 turns leases off: every allowed decision writes")
	o.global.addFlags(f)
	f.IntVar(&o.memoryMaxBuckets, "memory-max-buckets", memory.DefaultMaxBuckets, "memory backend: most buckets held; least recently used go first")
	f.BoolVar(&o.shadowMode, "shadow-mode", false, "decide and count, but answer OK to every request")
	f.BoolVar(&o.quotaMode, "quota-mode", false, "treat every limited descriptor as quota_mode does: over its limit, it fails a request only when all of the request's quota-mode descriptors are")
	f.StringSliceVar(&o.quotaGroupKeys, "quota-group-keys", nil, "entry keys (comma-separated) whose values make a request's quota-mode descriptors one quota, spent when any of them is over: backend_name,model_name_override for Envoy AI Gateway's QuotaPolicy; empty: each is a quota of its own")
	f.BoolVar(&o.dynamicMetadata, "response-dynamic-metadata", false, "add dynamic metadata to every answer: the domain, the descriptors and the metadata of the rules that passed")
	f.BoolVar(&o.responseHeaders, "response-headers", false, "add RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset, RateLimit-Policy and RateLimit to responses")
	f.BoolVar(&o.pprof, "pprof", false, "serve /debug/pprof/ on the debug address")
	// Far above what a healthy replica holds (docs/serve.md's "Overload"
	// explains them), so that only a flood or a stalled backend reaches
	// them.
	f.IntVar(&o.overload.MaxInFlight, "max-concurrent-calls", 1000, "most ShouldRateLimit calls worked on at once; more wait in a queue")
	f.IntVar(&o.overload.MaxQueued, "max-queued-calls", 500, "most ShouldRateLimit calls waiting for one of those in flight to finish; beyond, RESOURCE_EXHAUSTED at once; 0: no queue")
	f.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGTERM, how long in-flight calls may take to finish")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.logFormat, "log-format", "text", "text or json")
	f.Float64Var(&o.nearLimitRatio, "near-limit-ratio", 0.8, "share of a limit's burst used beyond which an allowed descriptor counts as near_limit in metrics")
	f.StringVar(&o.otlpEndpoint, "otlp-endpoint", "", "host:port of an OTLP/gRPC collector for traces and metrics; empty: none (metrics stay on /metrics)")
	f.BoolVar(&o.otlpInsecure, "otlp-insecure", false, "send OTLP without TLS (a collector on localhost or in the pod)")
	f.Float64Var(&o.traceSampling, "trace-sampling", 0.01, "fraction of calls traced when Envoy sends no sampling decision (0 to 1)")
	f.StringVar(&o.tlsCert, "tls-cert", "", "serve gRPC over TLS with this certificate (PEM, intermediates after it); reloaded when the file changes")
	f.StringVar(&o.tlsKey, "tls-key", "", "the key of --tls-cert (PEM)")
	f.StringVar(&o.tlsClientCA, "tls-client-ca", "", "require client certificates signed by this CA bundle (mutual TLS); reloaded when the file changes")
	f.DurationVar(&o.rlqs.ttl, "rlqs-assignment-ttl", 10*time.Second, "quota streams (Envoy's rate_limit_quota filter): how long a token bucket assignment lasts, in whole seconds; every token it can admit is taken from the shared bucket before it is sent")
	f.IntVar(&o.rlqs.maxStreams, "rlqs-max-streams", 1000, "quota streams: most open at once; one more is refused with RESOURCE_EXHAUSTED")
	f.IntVar(&o.rlqs.maxBuckets, "rlqs-max-buckets", 10000, "quota streams: most buckets one stream may report; reports of more are refused and counted")
	in := ratelimit.DefaultInputLimits()
	f.IntVar(&o.input.MaxDescriptors, "max-descriptors", in.MaxDescriptors, "most descriptors in one request; a request with more is refused with INVALID_ARGUMENT")
	f.IntVar(&o.input.MaxEntries, "max-entries", in.MaxEntries, "most entries in one descriptor; more is refused with INVALID_ARGUMENT")
	f.IntVar(&o.input.MaxKeyLen, "max-key-bytes", in.MaxKeyLen, "longest domain or entry key, in bytes; longer is refused with INVALID_ARGUMENT")
	f.IntVar(&o.input.MaxValueLen, "max-value-bytes", in.MaxValueLen, "longest entry value, in bytes; longer is refused with INVALID_ARGUMENT")
}

// checkInputLimits refuses a limit flag of zero or less. ratelimit.Options
// takes a zero limit as unset, so such a flag would quietly mean the
// default; it is a mistake to report instead.
func checkInputLimits(l ratelimit.InputLimits) error {
	for _, f := range []struct {
		flag string
		v    int
	}{{"--max-descriptors", l.MaxDescriptors}, {"--max-entries", l.MaxEntries}, {"--max-key-bytes", l.MaxKeyLen}, {"--max-value-bytes", l.MaxValueLen}} {
		if f.v <= 0 {
			return usageError{fmt.Errorf("%s %d: want a positive number", f.flag, f.v)}
		}
	}
	return nil
}

// server is a running `sluice serve`.
type server struct {
	log                     *slog.Logger
	grpc                    *grpc.Server
	health                  *health.Server
	httpSrv, debugSrv       *http.Server
	metricsSrv              *http.Server
	grpcLn, httpLn, debugLn net.Listener
	metricsLn               net.Listener
	rules                   ruleSource
	backend                 servedBackend
	telemetry               *telemetry.Telemetry
	admission               *admission.Controller
	// answered latches once the backend has answered a readiness probe:
	// a later backend outage is the failure policy's to handle, not a
	// reason to take every replica out of Envoy's endpoints.
	answered        atomic.Bool
	service         *ratelimit.Service
	quota           *rlqs.Service
	shuttingDown    atomic.Bool
	shutdownTimeout time.Duration
	errc            chan error
	stopWatch       context.CancelFunc
}

// startServer validates o, loads the rules, binds every listener and
// starts serving. Bad flags and unloadable rules fail here, before any
// port is served.
func startServer(ctx context.Context, o serveOptions, log *slog.Logger) (*server, error) {
	policy, err := ratelimit.ParseFailurePolicy(o.onBackendError)
	if err != nil {
		return nil, usageError{fmt.Errorf("--on-backend-error: %w", err)}
	}
	if o.nearLimitRatio <= 0 || o.nearLimitRatio > 1 {
		return nil, usageError{fmt.Errorf("--near-limit-ratio %v: want a fraction above 0, at most 1", o.nearLimitRatio)}
	}
	if err := checkInputLimits(o.input); err != nil {
		return nil, err
	}
	gate, err := newAdmission(o.overload)
	if err != nil {
		return nil, err
	}
	tel, err := telemetry.New(ctx, telemetry.Options{OTLPEndpoint: o.otlpEndpoint, OTLPInsecure: o.otlpInsecure,
		TraceSampling: o.traceSampling, SpanExporter: o.spanExporter, RatelimitStats: o.ratelimitMetrics})
	if err != nil {
		return nil, usageError{err}
	}
	be, err := openBackend(ctx, o, tel, log)
	if err != nil {
		tel.Shutdown(context.WithoutCancel(ctx))
		return nil, err
	}
	watchCtx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	rules, err := openRules(ctx, watchCtx, o, log)
	if err != nil {
		stopWatch()
		be.Close()
		tel.Shutdown(context.WithoutCancel(ctx))
		return nil, err // it names the directory, and each file:line at fault (or the xDS server)
	}
	s := &server{
		log:             log,
		rules:           rules,
		backend:         be,
		telemetry:       tel,
		shutdownTimeout: o.shutdownTimeout,
		admission:       gate,
		errc:            make(chan error, 3),
		stopWatch:       stopWatch,
	}
	var decider backend.Backend = s.backend
	if o.decorate != nil {
		decider = o.decorate(decider)
	}
	s.service = ratelimit.New(rules, tel.Backend(o.backend, decider), ratelimit.Options{
		ShadowMode:      o.shadowMode,
		QuotaMode:       o.quotaMode,
		QuotaGroupKeys:  o.quotaGroupKeys,
		DynamicMetadata: o.dynamicMetadata,
		OnBackendError:  policy,
		ResponseHeaders: o.responseHeaders,
		Logger:          log,
		Observer:        tel,
		NearLimitRatio:  o.nearLimitRatio,
		Input:           o.input,
	})
	quota, err := o.rlqs.service(rules, tel.Backend(o.backend, decider), log)
	if err != nil {
		s.close()
		return nil, err
	}
	s.quota = quota
	if err := tel.ObserveQuota(s.quotaStats); err != nil {
		s.close()
		return nil, err
	}
	if err := tel.ObserveRules(rules.Stats); err != nil {
		s.close()
		return nil, err
	}
	if err := tel.ObserveAdmission(gate.Stats); err != nil {
		s.close()
		return nil, err
	}
	if d, ok := be.(*ddb.Backend); ok {
		if err := tel.ObserveDynamoDB(d); err != nil {
			s.close()
			return nil, err
		}
	}
	if r, ok := be.(redisServed); ok {
		if err := tel.ObserveRedis(r.Backend); err != nil {
			s.close()
			return nil, err
		}
	}
	if m, ok := be.(interface{ Moving() *backend.Moving }); ok && m.Moving() != nil {
		if err := tel.ObserveMoving(m.Moving().Stats); err != nil {
			s.close()
			return nil, err
		}
	}
	// Admission first: a call shed costs no work beyond its decoding.
	// Only ShouldRateLimit is limited; health checks and reflection
	// answer however loaded the server is.
	grpcOpts := append(tel.GRPCServerOptions(), grpc.ChainUnaryInterceptor(
		gate.UnaryServerInterceptor(rlsv3.RateLimitService_ShouldRateLimit_FullMethodName),
		ratelimit.RecoverPanics(log)))
	if creds, err := s.serveTLS(watchCtx, o); err != nil {
		s.close()
		return nil, err
	} else if creds != nil {
		grpcOpts = append(grpcOpts, grpc.Creds(creds))
	}
	if err := s.listen(o); err != nil {
		s.close()
		return nil, err
	}

	s.grpc = grpc.NewServer(grpcOpts...)
	ratelimit.Register(s.grpc, s.service)
	rlqs.Register(s.grpc, s.quota)
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus("envoy.service.ratelimit.v3.RateLimitService", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus("envoy.service.rate_limit_quota.v3.RateLimitQuotaService", healthpb.HealthCheckResponse_SERVING)

	s.httpSrv = &http.Server{Handler: s.httpHandler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { s.errc <- s.grpc.Serve(s.grpcLn) }()
	go func() { s.errc <- ignoreClosed(s.httpSrv.Serve(s.httpLn)) }()
	if s.debugLn != nil {
		s.debugSrv = &http.Server{Handler: s.debugHandler(o.pprof), ReadHeaderTimeout: 5 * time.Second}
		go func() { s.errc <- ignoreClosed(s.debugSrv.Serve(s.debugLn)) }()
	}
	if s.metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", s.telemetry.MetricsHandler())
		s.metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { s.errc <- ignoreClosed(s.metricsSrv.Serve(s.metricsLn)) }()
	}
	limits := gate.Stats().Limits
	log.Info("sluice serving",
		slog.String("grpc", s.grpcLn.Addr().String()), slog.String("http", s.httpLn.Addr().String()),
		slog.String("debug", addrOf(s.debugLn)), slog.String("metrics", addrOf(s.metricsLn)),
		slog.String("backend", o.backend),
		slog.String("rules", rulesFrom(o)), slog.Int("domains", len(rules.Current().Domains())),
		slog.String("on_backend_error", policy.String()), slog.Bool("shadow_mode", o.shadowMode),
		slog.Int("max_concurrent_calls", limits.MaxInFlight), slog.Int("max_queued_calls", limits.MaxQueued))
	return s, nil
}

// newAdmission builds the admission control of --max-concurrent-calls and
// --max-queued-calls.
func newAdmission(lim admission.Limits) (*admission.Controller, error) {
	if lim.MaxInFlight < 1 {
		return nil, usageError{fmt.Errorf("--max-concurrent-calls %d: want at least 1", lim.MaxInFlight)}
	}
	if lim.MaxQueued < 0 {
		return nil, usageError{fmt.Errorf("--max-queued-calls %d: want 0 (no queue) or more", lim.MaxQueued)}
	}
	return admission.New(lim)
}

// servedBackend is what serve needs of a backend beyond deciding: a
// readiness probe and a release.
type servedBackend interface {
	backend.Backend
	Ping(context.Context) error
	Close() error
}

// openBackend builds the backend --backend names. The DynamoDB backend's
// table must exist: serve stops at once, naming the fix, rather than
// failing every request.
func openBackend(ctx context.Context, o serveOptions, tel *telemetry.Telemetry, log *slog.Logger) (servedBackend, error) {
	// The memory backend has no store to share records through: its
	// global rules stay at the region's base.
	global, err := o.global.global(o.backend != "memory")
	if err != nil {
		return nil, err
	}
	switch o.backend {
	case "memory":
		var ov *memory.Overrides
		if o.overrides != "" {
			var err error
			if ov, err = memory.LoadOverrides(o.overrides); err != nil {
				return nil, err
			}
		}
		return memory.New(memory.Options{Overrides: ov, TTLMultiplier: o.ttlMultiplier, MaxBuckets: o.memoryMaxBuckets,
			OnBucketWrite: tel.BucketWritten, Global: global}), nil
	case "dynamodb":
		if o.table == "" {
			return nil, usageError{errors.New("--backend dynamodb needs --table (create it with: sluice table create --table NAME)")}
		}
		if o.overrides != "" {
			return nil, usageError{errors.New("--overrides is for the memory backend; the dynamodb backend keeps its limits in the table")}
		}
		if o.configCacheTTL <= 0 {
			return nil, usageError{fmt.Errorf("--config-cache-ttl %v: want a positive duration", o.configCacheTTL)}
		}
		if o.leaseHorizon < 0 {
			return nil, usageError{fmt.Errorf("--lease-horizon %v: want 0 (off) or a positive duration", o.leaseHorizon)}
		}
		if o.denyStaleness < 0 {
			return nil, usageError{fmt.Errorf("--deny-staleness %v: want 0 (off) or a positive duration", o.denyStaleness)}
		}
		client, err := newDynamoDBClient(ctx, o.region, o.endpoint, log)
		if err != nil {
			return nil, err
		}
		checkCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := ddb.CheckTable(checkCtx, client, o.table); err != nil {
			return nil, err
		}
		opts := ddb.Options{Table: o.table, KeyPrefix: o.keyPrefix, TTLMultiplier: o.ttlMultiplier,
			ConfigCacheTTL: o.configCacheTTL, MaxDenyStaleness: o.denyStaleness, LeaseHorizon: o.leaseHorizon,
			OnBucketWrite: tel.BucketWritten, Global: global}
		if o.leaseHorizon == 0 {
			opts.LeaseHorizon = -1 // the backend's "no leases"
		}
		if !o.coalesceWrites {
			opts.MaxBatch = 1
		}
		if o.denyStaleness == 0 {
			opts.MaxDenyStaleness = -1 // the backend's "always ask"
		}
		return ddb.New(tel.DynamoDB(client), opts)
	case "redis":
		if o.overrides != "" {
			return nil, usageError{errors.New("--overrides is for the memory backend; the redis backend keeps its limits in Redis (sluice limits set --backend redis)")}
		}
		if o.configCacheTTL <= 0 {
			return nil, usageError{fmt.Errorf("--config-cache-ttl %v: want a positive duration", o.configCacheTTL)}
		}
		dialCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		client, err := dialRedis(dialCtx, o.redis)
		if err != nil {
			return nil, err
		}
		if o.leaseHorizon < 0 {
			return nil, usageError{fmt.Errorf("--lease-horizon %v: want 0 (off) or a positive duration", o.leaseHorizon)}
		}
		ro := redis.Options{KeyPrefix: o.keyPrefix, TTLMultiplier: o.ttlMultiplier,
			ConfigCacheTTL: o.configCacheTTL, OnBucketWrite: tel.BucketWritten, Call: tel.RedisCall,
			LeaseHorizon: o.leaseHorizon, Global: global}
		if !o.coalesceWrites {
			ro.MaxBatch = 1
		}
		b, err := redis.New(client, ro)
		if err != nil {
			client.Close()
			return nil, usageError{err}
		}
		return redisServed{b, client}, nil
	}
	return nil, usageError{fmt.Errorf("--backend %q: want memory, dynamodb or redis", o.backend)}
}

// serveTLS loads the TLS files, if any, and keeps them reloaded until
// ctx ends; nil credentials mean plaintext.
func (s *server) serveTLS(ctx context.Context, o serveOptions) (credentials.TransportCredentials, error) {
	switch {
	case o.tlsCert == "" && o.tlsKey == "" && o.tlsClientCA == "":
		return nil, nil
	case o.tlsCert == "" || o.tlsKey == "":
		return nil, usageError{errors.New("--tls-cert and --tls-key go together (and --tls-client-ca needs both)")}
	}
	r, err := certs.New(certs.Files{Cert: o.tlsCert, Key: o.tlsKey, ClientCA: o.tlsClientCA}, s.log)
	if err != nil {
		return nil, err
	}
	if err := s.telemetry.ObserveTLS(r.Stats); err != nil {
		return nil, err
	}
	go r.Watch(ctx, 0)
	return credentials.NewTLS(r.TLSConfig()), nil
}

func (s *server) listen(o serveOptions) error {
	var err error
	if s.grpcLn, err = net.Listen("tcp", o.grpcAddr); err != nil {
		return fmt.Errorf("--grpc-addr: %w", err)
	}
	if s.httpLn, err = net.Listen("tcp", o.httpAddr); err != nil {
		return fmt.Errorf("--http-addr: %w", err)
	}
	if o.debugAddr != "" {
		if s.debugLn, err = net.Listen("tcp", o.debugAddr); err != nil {
			return fmt.Errorf("--debug-addr: %w", err)
		}
	}
	if o.metricsAddr != "" {
		if s.metricsLn, err = net.Listen("tcp", o.metricsAddr); err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
	}
	return nil
}

// wait serves until ctx is done (SIGTERM, SIGINT) or a listener fails,
// then shuts down gracefully: readiness goes false, gRPC health reports
// NOT_SERVING, in-flight calls get shutdownTimeout to finish.
func (s *server) wait(ctx context.Context) error {
	var err error
	select {
	case <-ctx.Done():
		s.log.Info("shutting down", slog.Duration("timeout", s.shutdownTimeout))
	case err = <-s.errc:
		s.log.Error("server failed", slog.Any("error", err))
	}
	s.shutdown()
	return err
}

func (s *server) shutdown() {
	s.shuttingDown.Store(true)
	s.health.Shutdown()
	// Quota streams never end on their own: they end now, and their
	// Envoys reconnect to another replica, keeping their assignments.
	s.quota.Drain()
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.shutdownTimeout):
		s.log.Warn("in-flight calls did not finish in time; closing")
		s.grpc.Stop()
	}
	// Charges go on being written after Envoy has its answer; closing
	// the backend under them would lose them.
	settle, cancelSettle := context.WithTimeout(context.Background(), ratelimit.ChargeTimeout)
	if err := s.service.Settle(settle); err != nil {
		s.log.Warn("charges cut off by shutdown", slog.Any("error", err))
	}
	cancelSettle()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s.httpSrv.Shutdown(ctx)
	for _, srv := range []*http.Server{s.debugSrv, s.metricsSrv} {
		if srv != nil {
			srv.Shutdown(ctx)
		}
	}
	s.close()
}

func (s *server) close() {
	for _, ln := range []net.Listener{s.grpcLn, s.httpLn, s.debugLn, s.metricsLn} {
		if ln != nil {
			ln.Close()
		}
	}
	s.stopWatch()
	s.backend.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.telemetry.Shutdown(ctx); err != nil {
		s.log.Warn("telemetry did not flush", slog.Any("error", err))
	}
}

func (s *server) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	// envoyproxy/ratelimit's health check, which Envoy Gateway's pod
	// probes: OK while serving (with or without rules yet), not once
	// shutting down.
	mux.HandleFunc("GET /healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		if s.shuttingDown.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "OK")
	})
	mux.Handle("GET /metrics", s.telemetry.MetricsHandler())
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.ready(r.Context()); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// ready is true once the rules are loaded and the backend has answered,
// until the process starts shutting down. The backend is asked only until
// it first answers: an outage later is answered by the failure policy,
// and must not take every replica out of service at once.
func (s *server) ready(ctx context.Context) error {
	if s.shuttingDown.Load() {
		return errors.New("shutting down")
	}
	if s.rules.Current() == nil {
		return errors.New("rules not loaded")
	}
	if s.answered.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := s.backend.Ping(ctx); err != nil {
		return fmt.Errorf("backend has not answered yet: %w", err)
	}
	s.answered.Store(true)
	return nil
}

func (s *server) debugHandler(withPprof bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/config", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(s.describe())
	})
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// configView is the JSON of /debug/config.
type configView struct {
	Fingerprint string          `json:"fingerprint"`
	Domains     []string        `json:"domains"`
	Rules       []ruleView      `json:"rules"`
	Reloads     reloadView      `json:"reloads"`
	Decisions   ratelimit.Stats `json:"decisions"`
	Quota       rlqs.Stats      `json:"quota_streams"`
	DynamoDB    *dynamoDBView   `json:"dynamodb,omitempty"`
	Redis       *redisView      `json:"redis,omitempty"`
	Overload    overloadView    `json:"overload"`
}

// overloadView shows the admission control of ShouldRateLimit calls: its
// limits, what it holds now, and the calls shed so far by reason.
type overloadView struct {
	MaxConcurrentCalls int               `json:"max_concurrent_calls"`
	MaxQueuedCalls     int               `json:"max_queued_calls"`
	InFlight           int               `json:"in_flight"`
	Queued             int               `json:"queued"`
	Shed               map[string]uint64 `json:"shed"`
}

func describeOverload(st admission.Stats) overloadView {
	return overloadView{MaxConcurrentCalls: st.MaxInFlight, MaxQueuedCalls: st.MaxQueued,
		InFlight: st.InFlight, Queued: st.Queued,
		Shed: map[string]uint64{admission.ReasonQueueFull: st.ShedQueueFull, admission.ReasonDeadline: st.ShedDeadline}}
}

// dynamoDBView shows what the DynamoDB backend has cost so far: calls and
// failed calls per operation, capacity units consumed, config cache use,
// writes that lost a race and were recomputed, decisions answered without
// a call, decisions that shared another's write, and the leases.
type dynamoDBView struct {
	Calls            map[string]uint64 `json:"calls"`
	Errors           map[string]uint64 `json:"errors"`
	ReadUnits        float64           `json:"read_capacity_units"`
	WriteUnits       float64           `json:"write_capacity_units"`
	CacheHits        uint64            `json:"config_cache_hits"`
	CacheMisses      uint64            `json:"config_cache_misses"`
	ConditionRetries uint64            `json:"condition_retries"`
	LocalAnswers     uint64            `json:"local_answers"`
	Coalesced        uint64            `json:"coalesced_decisions"`
	Contended        uint64            `json:"contended_denials"`
	DeadlineDenials  uint64            `json:"deadline_denials"`
	Leases           leaseView         `json:"leases"`
}

// leaseView shows the tokens this replica has leased from buckets, in
// tokens: moved into leases, given back, lost, held now; and the writes
// that leased or gave back.
type leaseView struct {
	Horizon     string  `json:"horizon"`
	Leased      float64 `json:"leased"`
	Returned    float64 `json:"returned"`
	Dropped     float64 `json:"dropped"`
	Cut         float64 `json:"cut"`
	Outstanding float64 `json:"outstanding"`
	Writes      uint64  `json:"writes"`
}

// redisView shows what the Redis backend has done so far: runs of the
// decision script and those that failed, decisions that went in another's
// run, config cache use, and, with leases, decisions answered from them,
// denials at the deadline and the leases.
type redisView struct {
	Scripts         uint64     `json:"scripts"`
	ScriptErrors    uint64     `json:"script_errors"`
	Coalesced       uint64     `json:"coalesced_decisions"`
	CacheHits       uint64     `json:"config_cache_hits"`
	CacheMisses     uint64     `json:"config_cache_misses"`
	LocalAnswers    uint64     `json:"local_answers"`
	DeadlineDenials uint64     `json:"deadline_denials"`
	Leases          *leaseView `json:"leases,omitempty"`
}

// describeLeases is what /debug/config shows of a backend's leases.
func describeLeases(horizon time.Duration, st *backend.LeaseStats) leaseView {
	return leaseView{Horizon: horizon.String(),
		Leased: float64(st.Leased.Load()) / 1000, Returned: float64(st.Returned.Load()) / 1000,
		Dropped: float64(st.LeaseDropped.Load()) / 1000, Cut: float64(st.LeaseCut.Load()) / 1000, Outstanding: float64(st.LeaseOutstanding.Load()) / 1000,
		Writes: st.LeaseWrites.Load()}
}

type reloadView struct {
	OK          uint64    `json:"ok"`
	Failed      uint64    `json:"failed"`
	LastError   string    `json:"last_error,omitempty"`
	LastOK      time.Time `json:"last_ok"`
	LastAttempt time.Time `json:"last_attempt"`
}

type ruleView struct {
	Domain    string   `json:"domain"`
	Path      string   `json:"path"`
	Source    string   `json:"source"`
	Name      string   `json:"name,omitempty"`
	Limits    []string `json:"limits,omitempty"`
	Unlimited bool     `json:"unlimited,omitempty"`
	Shadow    bool     `json:"shadow_mode,omitempty"`
	Quota     bool     `json:"quota_mode,omitempty"`
	Global    bool     `json:"global,omitempty"`
	Replaces  []string `json:"replaces,omitempty"`
}

// describe is what /debug/config shows of s.
func (s *server) describe() configView {
	rules, svc, be := s.rules, s.service, s.backend
	cfg := rules.Current()
	st := rules.Stats()
	v := configView{
		Fingerprint: cfg.Fingerprint(),
		Domains:     cfg.Domains(),
		Reloads:     reloadView{OK: st.OK, Failed: st.Failed, LastError: st.LastError, LastOK: st.LastOK, LastAttempt: st.LastAttempt},
		Decisions:   svc.Stats(),
		Quota:       s.quota.Stats(),
		Overload:    describeOverload(s.admission.Stats()),
	}
	if d, ok := be.(*ddb.Backend); ok {
		st := d.Stats()
		calls, errs := st.Calls()
		v.DynamoDB = &dynamoDBView{
			Calls: calls, Errors: errs,
			ReadUnits:  float64(st.ReadMilliUnits.Load()) / 1000,
			WriteUnits: float64(st.WriteMilliUnits.Load()) / 1000,
			CacheHits:  st.CacheHits.Load(), CacheMisses: st.CacheMisses.Load(),
			ConditionRetries: st.ConditionRetries.Load(),
			LocalAnswers:     st.LocalAnswers.Load(), Coalesced: st.Coalesced.Load(),
			Contended: st.Contended.Load(), DeadlineDenials: st.DeadlineDenials.Load(),
			Leases: describeLeases(d.LeaseHorizon(), &st.LeaseStats),
		}
	}
	if r, ok := be.(redisServed); ok {
		st := r.Stats()
		v.Redis = &redisView{Scripts: st.Scripts.Load(), ScriptErrors: st.ScriptErrors.Load(),
			Coalesced: st.Coalesced.Load(), CacheHits: st.CacheHits.Load(), CacheMisses: st.CacheMisses.Load(),
			LocalAnswers: st.LocalAnswers.Load(), DeadlineDenials: st.DeadlineDenials.Load()}
		if h := r.LeaseHorizon(); h > 0 {
			l := describeLeases(h, &st.LeaseStats)
			v.Redis.Leases = &l
		}
	}
	for _, r := range cfg.Rules() {
		rv := ruleView{Domain: r.Domain, Path: r.Path, Source: fmt.Sprintf("%s:%d", r.File, r.Line),
			Name: r.Name, Unlimited: r.Unlimited, Shadow: r.ShadowMode, Quota: r.QuotaMode, Global: r.Global, Replaces: r.Replaces}
		for _, l := range r.Limits {
			rv.Limits = append(rv.Limits, l.String())
		}
		v.Rules = append(v.Rules, rv)
	}
	return v
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func addrOf(ln net.Listener) string {
	if ln == nil {
		return "off"
	}
	return ln.Addr().String()
}
