package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// QuotaStats are the totals of a replica's quota streams (Envoy's
// rate_limit_quota filter, DESIGN section 15), as ObserveQuota reads
// them.
type QuotaStats struct {
	// Streams and Buckets are open now.
	Streams, Buckets int64
	// TokenBuckets, DenyAll and AllowAll count the assignments sent by
	// kind; Abandoned the buckets abandoned.
	TokenBuckets, DenyAll, AllowAll, Abandoned uint64
	// Leased counts the tokens taken from shared buckets for assignments,
	// Stranded those lost with a stream or an abandoned bucket, Returned
	// those given up unused while the bucket was contended, to the
	// replica's spares for the bucket.
	Leased, Stranded, Returned uint64
	// Refused counts usage reports refused; BackendErrors renewals the
	// backend failed.
	Refused, BackendErrors uint64
}

// ObserveQuota reports a replica's quota streams: sluice_rlqs_streams,
// sluice_rlqs_buckets, sluice_rlqs_assignments_total{kind},
// sluice_rlqs_abandoned_total, sluice_rlqs_tokens_leased_total,
// sluice_rlqs_tokens_stranded_total, sluice_rlqs_tokens_returned_total,
// sluice_rlqs_reports_refused_total
// and sluice_rlqs_backend_errors_total.
func (t *Telemetry) ObserveQuota(stats func() QuotaStats) error {
	m := t.meter
	streams, err1 := m.Int64ObservableGauge("sluice.rlqs.streams", metric.WithUnit("{stream}"),
		metric.WithDescription("Quota streams open now: one per Envoy whose rate_limit_quota filter is connected to this replica."))
	buckets, err2 := m.Int64ObservableGauge("sluice.rlqs.buckets", metric.WithUnit("{bucket}"),
		metric.WithDescription("Buckets the open quota streams report, summed over streams."))
	assignments, err3 := m.Int64ObservableCounter("sluice.rlqs.assignments", metric.WithUnit("{assignment}"),
		metric.WithDescription("Assignments sent to Envoys, by kind: token_bucket, deny_all (the limit reached), allow_all (no rule limits the bucket)."))
	abandoned, err4 := m.Int64ObservableCounter("sluice.rlqs.abandoned", metric.WithUnit("{bucket}"),
		metric.WithDescription("Buckets abandoned: their Envoy reported no requests in them for the idle time (30 s)."))
	leased, err5 := m.Int64ObservableCounter("sluice.rlqs.tokens_leased", metric.WithUnit("{token}"),
		metric.WithDescription("Tokens taken from shared buckets for assignments, before they were sent."))
	stranded, err6 := m.Int64ObservableCounter("sluice.rlqs.tokens_stranded", metric.WithUnit("{token}"),
		metric.WithDescription("Tokens taken for streams that ended, or buckets abandoned, before their Envoy could have admitted them: under-admission, counted high."))
	returned, err9 := m.Int64ObservableCounter("sluice.rlqs.tokens_returned", metric.WithUnit("{token}"),
		metric.WithDescription("Tokens an Envoy's reports showed it could no longer use, given up while the bucket was contended to this replica's spare tokens for the bucket, from which its other Envoys' next takes are paid first."))
	refused, err7 := m.Int64ObservableCounter("sluice.rlqs.reports_refused", metric.WithUnit("{report}"),
		metric.WithDescription("Bucket usage reports refused: a bad bucket id, an absurd count, a stream over its bucket limit."))
	errs, err8 := m.Int64ObservableCounter("sluice.rlqs.backend_errors", metric.WithUnit("{error}"),
		metric.WithDescription("Assignment renewals the backend failed; each is retried a second later while the assignment in force runs."))
	for _, err := range []error{err1, err2, err3, err4, err5, err6, err7, err8, err9} {
		if err != nil {
			return err
		}
	}
	kind := func(k string) metric.ObserveOption { return metric.WithAttributes(attribute.String("kind", k)) }
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := stats()
		o.ObserveInt64(streams, s.Streams)
		o.ObserveInt64(buckets, s.Buckets)
		o.ObserveInt64(assignments, int64(s.TokenBuckets), kind("token_bucket"))
		o.ObserveInt64(assignments, int64(s.DenyAll), kind("deny_all"))
		o.ObserveInt64(assignments, int64(s.AllowAll), kind("allow_all"))
		o.ObserveInt64(abandoned, int64(s.Abandoned))
		o.ObserveInt64(leased, int64(s.Leased))
		o.ObserveInt64(stranded, int64(s.Stranded))
		o.ObserveInt64(returned, int64(s.Returned))
		o.ObserveInt64(refused, int64(s.Refused))
		o.ObserveInt64(errs, int64(s.BackendErrors))
		return nil
	}, streams, buckets, assignments, abandoned, leased, stranded, returned, refused, errs)
	return err
}
