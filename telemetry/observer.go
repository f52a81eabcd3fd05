package telemetry

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	grpccodes "google.golang.org/grpc/codes"

	"github.com/sluice-rl/sluice/ratelimit"
)

// unknownDomain stands for every domain no rule file defines: such a
// domain is request data, and must not become a label value.
const unknownDomain = "_unknown_"

// Decided implements ratelimit.Observer.
func (t *Telemetry) Decided(ctx context.Context, d ratelimit.Decided) {
	rule, domain := "", d.Domain
	if d.Rule != nil {
		rule = d.Rule.Path
	}
	if !d.KnownDomain {
		domain = unknownDomain
	}
	code := d.Outcome.String()
	t.inst.decisions.Add(ctx, 1, t.set(attrKey{"decisions", domain, rule, code, ""}, "domain", "rule", "code").add...)
	if d.Rule != nil && d.Rule.DetailedMetric {
		// Not cached: entities are unbounded, and the rule opted in.
		t.inst.detailedDecisions.Add(ctx, 1, metric.WithAttributes(attribute.String("domain", d.Domain),
			attribute.String("rule", rule), attribute.String("entity", d.Entity), attribute.String("code", code)))
	}
	if t.rlStats != nil && d.Rule != nil && !d.Refund {
		t.rlStats.observe(d)
	}
}

// Answered implements ratelimit.Observer: it times the call and marks the
// call's span with the domain and the outcome.
func (t *Telemetry) Answered(ctx context.Context, a ratelimit.Answered) {
	domain := a.Domain
	if !a.KnownDomain {
		domain = unknownDomain
	}
	t.inst.requestDuration.Record(ctx, a.Duration.Seconds(), t.set(attrKey{"requests", domain, a.Code.String(), "", ""}, "domain", "grpc_code").rec...)
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	outcome := a.Overall.String()
	if a.Code != grpccodes.OK {
		outcome = a.Code.String()
	}
	span.SetAttributes(attribute.String("sluice.domain", domain), attribute.String("sluice.outcome", outcome))
}

// FailurePolicyApplied implements ratelimit.Observer.
func (t *Telemetry) FailurePolicyApplied(ctx context.Context, domain string, policy ratelimit.FailurePolicy, err error) {
	t.inst.failurePolicy.Add(ctx, 1, t.set(attrKey{"policy", domain, policy.String(), "", ""}, "domain", "policy").add...)
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent("failure policy applied", trace.WithAttributes(attribute.String("policy", policy.String())))
		span.SetStatus(codes.Error, "backend failed")
	}
}

// BucketWritten counts a bucket write and the TTL it set (0: none); it is
// the backends' OnBucketWrite.
func (t *Telemetry) BucketWritten(ttl time.Duration) {
	ctx := context.Background()
	if ttl <= 0 {
		t.inst.bucketWrites.Add(ctx, 1, t.set(attrKey{inst: "writes", a: "none"}, "ttl").add...)
		return
	}
	t.inst.bucketWrites.Add(ctx, 1, t.set(attrKey{inst: "writes", a: "set"}, "ttl").add...)
	t.inst.bucketTTL.Record(ctx, ttl.Seconds())
}
