package telemetry

import (
	"fmt"

	"go.opentelemetry.io/otel/metric"
)

// instruments are Sluice's metrics. The Prometheus names follow from the
// OpenTelemetry ones: dots become underscores, counters end in _total and
// seconds in _seconds (sluice.request.duration is
// sluice_request_duration_seconds). docs/metrics.md lists them all.
type instruments struct {
	decisions         metric.Int64Counter
	detailedDecisions metric.Int64Counter
	requestDuration   metric.Float64Histogram
	backendDuration   metric.Float64Histogram
	backendErrors     metric.Int64Counter
	failurePolicy     metric.Int64Counter
	bucketWrites      metric.Int64Counter
	bucketTTL         metric.Float64Histogram
}

// latencyBuckets span what a rate-limit call takes: sub-millisecond in
// memory to Envoy's timeouts of tens of milliseconds and beyond.
func latencyBuckets() []float64 {
	return []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}
}

// ttlBuckets span bucket TTLs: seconds for per-second limits to weeks for
// daily quotas (ADR-031 asks for their distribution).
func ttlBuckets() []float64 {
	return []float64{10, 60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400}
}

func newInstruments(m metric.Meter) (instruments, error) {
	var in instruments
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var err error
	in.decisions, err = m.Int64Counter("sluice.decisions", metric.WithUnit("{descriptor}"),
		metric.WithDescription("Descriptors decided, by domain, rule and code (ok, near_limit, over_limit, shadow_over_limit, unlimited, unmatched)."))
	add(err)
	in.detailedDecisions, err = m.Int64Counter("sluice.detailed_decisions", metric.WithUnit("{descriptor}"),
		metric.WithDescription("Descriptors decided by rules with detailed_metric, by domain, rule, entity and code."))
	add(err)
	in.requestDuration, err = m.Float64Histogram("sluice.request.duration", metric.WithUnit("s"),
		metric.WithDescription("ShouldRateLimit calls, by domain and gRPC code, and how long they took."),
		metric.WithExplicitBucketBoundaries(latencyBuckets()...))
	add(err)
	in.backendDuration, err = m.Float64Histogram("sluice.backend.call.duration", metric.WithUnit("s"),
		metric.WithDescription("Backend calls, by backend and operation (decide, or the DynamoDB API call), and how long they took."),
		metric.WithExplicitBucketBoundaries(latencyBuckets()...))
	add(err)
	in.backendErrors, err = m.Int64Counter("sluice.backend.call.errors", metric.WithUnit("{call}"),
		metric.WithDescription("Backend calls that failed, by backend, operation and kind (timeout, an AWS error code, error)."))
	add(err)
	in.failurePolicy, err = m.Int64Counter("sluice.failure_policy.activations", metric.WithUnit("{descriptor}"),
		metric.WithDescription("Descriptors answered by the failure policy because the backend failed, by domain and policy."))
	add(err)
	in.bucketWrites, err = m.Int64Counter("sluice.bucket.writes", metric.WithUnit("{write}"),
		metric.WithDescription("Bucket writes, by whether they set a TTL (ttl=set) or not (ttl=none)."))
	add(err)
	in.bucketTTL, err = m.Float64Histogram("sluice.bucket.ttl", metric.WithUnit("s"),
		metric.WithDescription("The TTL bucket writes set (writes without TTL are not in it)."),
		metric.WithExplicitBucketBoundaries(ttlBuckets()...))
	add(err)
	if len(errs) > 0 {
		return in, fmt.Errorf("telemetry instruments: %v", errs)
	}
	return in, nil
}
