// Package telemetry turns what Sluice does into OpenTelemetry metrics and
// traces: metrics scraped by Prometheus from /metrics (and pushed over
// OTLP when an endpoint is set), traces exported over OTLP.
//
// A Telemetry is built once per process by New and handed to the parts it
// observes: it is the ratelimit.Observer of the service, it wraps the
// backend and the DynamoDB client to time their calls, and it reads the
// running totals of the rules watcher and the DynamoDB backend when
// scraped. Nothing is global: the meter and tracer providers live in the
// Telemetry, and Shutdown flushes them.
//
// Label values come from configuration only (domains that have rule files,
// rule paths, operation names), so the number of series stays bounded
// whatever the requests carry. The exceptions are opt-in, by the rule: a
// rule with detailed_metric adds its entities to
// sluice_detailed_decisions_total, and with Options.RatelimitStats a rule
// with value_to_metric or detailed_metric puts request values into the
// key labels of ratelimit_service_rate_limit_*, as envoyproxy/ratelimit
// does.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/propagators/b3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
)

// Options configure a Telemetry. The zero value serves Prometheus metrics
// and records no traces.
type Options struct {
	// OTLPEndpoint, when set (host:port), receives traces and metrics
	// over OTLP/gRPC.
	OTLPEndpoint string
	// OTLPInsecure sends OTLP without TLS (a collector on localhost or in
	// the pod).
	OTLPInsecure bool
	// TraceSampling is the fraction of calls traced when Envoy sends no
	// sampling decision of its own (0 to 1); a decision Envoy propagates is
	// always followed.
	TraceSampling float64
	// RatelimitStats adds envoyproxy/ratelimit's per-rule counters under
	// the Prometheus names dashboards built for it read
	// (ratelimit_service_rate_limit_*, see ratelimitStats).
	RatelimitStats bool
	// SpanExporter receives spans besides OTLP, synchronously as each
	// ends; tests use an in-memory one.
	SpanExporter sdktrace.SpanExporter
}

// Telemetry owns the meter and tracer providers of a process. It is safe
// for concurrent use.
type Telemetry struct {
	registry   *prometheus.Registry
	meters     *sdkmetric.MeterProvider
	tracers    *sdktrace.TracerProvider // nil when no trace is exported
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	meter      metric.Meter
	inst       instruments
	rlStats    *ratelimitStats // nil unless Options.RatelimitStats
	// attrs caches the attribute sets of measurements by their label
	// values: building a set sorts and allocates, and on the request path
	// the same few sets recur (their number is bounded by the rules).
	attrsMu sync.RWMutex
	attrs   map[attrKey]attrOpts
}

// attrOpts carries one attribute set as the option slices instruments
// take: passing a cached slice with ... costs no allocation, where a
// single option would be boxed into a new slice on every call.
type attrOpts struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

// attrKey is up to four label values of one instrument's measurement.
type attrKey struct {
	inst       string
	a, b, c, d string
}

// set returns the measurement option for the label pairs names/values,
// building it once per distinct key.
func (t *Telemetry) set(k attrKey, names ...string) attrOpts {
	// A typed map, not a sync.Map: boxing the key for sync.Map would
	// allocate on every call.
	t.attrsMu.RLock()
	o, ok := t.attrs[k]
	t.attrsMu.RUnlock()
	if ok {
		return o
	}
	values := [...]string{k.a, k.b, k.c, k.d}
	kvs := make([]attribute.KeyValue, len(names))
	for i, n := range names {
		kvs[i] = attribute.String(n, values[i])
	}
	opt := metric.WithAttributeSet(attribute.NewSet(kvs...))
	o = attrOpts{add: []metric.AddOption{opt}, rec: []metric.RecordOption{opt}}
	t.attrsMu.Lock()
	t.attrs[k] = o
	t.attrsMu.Unlock()
	return o
}

// New builds the providers and instruments. It starts no goroutine of its
// own beyond those of the OTLP exporters, which Shutdown stops.
func New(ctx context.Context, opts Options) (*Telemetry, error) {
	if opts.TraceSampling < 0 || opts.TraceSampling > 1 {
		return nil, fmt.Errorf("trace sampling %v: want a fraction from 0 to 1", opts.TraceSampling)
	}
	res, err := resource.Merge(resource.Default(), resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceName("sluice"), semconv.ServiceVersion(moduleVersion())))
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	t := &Telemetry{
		registry: prometheus.NewRegistry(),
		attrs:    map[attrKey]attrOpts{},
		// Envoy propagates W3C trace context or B3, depending on its
		// tracer; read both, write W3C.
		propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, b3.New(b3.WithInjectEncoding(b3.B3MultipleHeader))),
	}
	exporter, err := otelprom.New(otelprom.WithRegisterer(t.registry), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(exporter)}
	var spanOpts []sdktrace.TracerProviderOption
	if opts.SpanExporter != nil {
		spanOpts = append(spanOpts, sdktrace.WithSyncer(opts.SpanExporter))
	}
	if opts.OTLPEndpoint != "" {
		mexp, err := otlpmetricgrpc.New(ctx, otlpMetricOptions(opts)...)
		if err != nil {
			return nil, fmt.Errorf("OTLP metric exporter for %s: %w", opts.OTLPEndpoint, err)
		}
		mopts = append(mopts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mexp)))
		texp, err := otlptracegrpc.New(ctx, otlpTraceOptions(opts)...)
		if err != nil {
			return nil, fmt.Errorf("OTLP trace exporter for %s: %w", opts.OTLPEndpoint, err)
		}
		spanOpts = append(spanOpts, sdktrace.WithBatcher(texp))
	}
	t.meters = sdkmetric.NewMeterProvider(mopts...)
	t.meter = t.meters.Meter("github.com/sluice-rl/sluice")
	if len(spanOpts) > 0 {
		t.tracers = sdktrace.NewTracerProvider(append(spanOpts, sdktrace.WithResource(res),
			sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(opts.TraceSampling))))...)
		t.tracer = t.tracers.Tracer("github.com/sluice-rl/sluice")
	} else {
		t.tracer = tracenoop.NewTracerProvider().Tracer("")
	}
	if t.inst, err = newInstruments(t.meter); err != nil {
		return nil, err
	}
	if opts.RatelimitStats {
		if t.rlStats, err = newRatelimitStats(t.registry); err != nil {
			return nil, fmt.Errorf("envoyproxy/ratelimit counters: %w", err)
		}
	}
	return t, nil
}

func otlpMetricOptions(o Options) []otlpmetricgrpc.Option {
	opts := []otlpmetricgrpc.Option{otlpmetricgrpc.WithEndpoint(o.OTLPEndpoint)}
	if o.OTLPInsecure {
		opts = append(opts, otlpmetricgrpc.WithInsecure())
	}
	return opts
}

func otlpTraceOptions(o Options) []otlptracegrpc.Option {
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(o.OTLPEndpoint)}
	if o.OTLPInsecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	return opts
}

// MetricsHandler serves the metrics in the Prometheus text format.
func (t *Telemetry) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(t.registry, promhttp.HandlerOpts{})
}

// GRPCServerOptions are what a gRPC server needs for traces: a handler
// that starts a span for every call, continuing the trace Envoy
// propagates in the call's metadata (W3C trace context or B3). Without a
// trace exporter there are none, and calls pay nothing for tracing.
func (t *Telemetry) GRPCServerOptions() []grpc.ServerOption {
	if t.tracers == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(t.tracers),
		otelgrpc.WithPropagators(t.propagator),
		// Sluice's own metrics cover the calls; otelgrpc's would be a
		// second, undocumented set.
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
	))}
}

// Shutdown flushes and stops the exporters, within ctx.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	if t.tracers != nil {
		errs = append(errs, t.tracers.Shutdown(ctx))
	}
	errs = append(errs, t.meters.Shutdown(ctx))
	return errors.Join(errs...)
}

// moduleVersion is the version Go stamped into the binary: a tag for a
// release built with go install, "(devel)" for a build from a checkout.
func moduleVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.Main.Version
	}
	return "unknown"
}
