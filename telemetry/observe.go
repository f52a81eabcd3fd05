package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-rl/sluice/admission"
	sluiceddb "github.com/sluice-rl/sluice/backend/dynamodb"
	"github.com/sluice-rl/sluice/certs"
	"github.com/sluice-rl/sluice/descriptors"
)

// ObserveRules reports the rules watcher's reloads when metrics are read:
// sluice_config_reloads_total{result="ok"|"failed"}.
func (t *Telemetry) ObserveRules(stats func() descriptors.ReloadStats) error {
	reloads, err := t.meter.Int64ObservableCounter("sluice.config.reloads", metric.WithUnit("{reload}"),
		metric.WithDescription("Loads of the rule files, by result (ok, failed); the first load counts."))
	if err != nil {
		return err
	}
	_, err = t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := stats()
		o.ObserveInt64(reloads, int64(s.OK), metric.WithAttributes(attribute.String("result", "ok")))
		o.ObserveInt64(reloads, int64(s.Failed), metric.WithAttributes(attribute.String("result", "failed")))
		return nil
	}, reloads)
	return err
}

// ObserveDynamoDB reports the DynamoDB backend's running totals when
// metrics are read: capacity consumed, lost write races, decisions that
// needed no call or shared a write, and the config cache.
func (t *Telemetry) ObserveDynamoDB(b *sluiceddb.Backend) error {
	m := t.meter
	rcu, err1 := m.Float64ObservableCounter("sluice.dynamodb.read_capacity_units", metric.WithUnit("{unit}"),
		metric.WithDescription("Read capacity units DynamoDB reported consumed."))
	wcu, err2 := m.Float64ObservableCounter("sluice.dynamodb.write_capacity_units", metric.WithUnit("{unit}"),
		metric.WithDescription("Write capacity units DynamoDB reported consumed."))
	retries, err3 := m.Int64ObservableCounter("sluice.dynamodb.condition_retries", metric.WithUnit("{write}"),
		metric.WithDescription("Bucket writes that lost a race to another writer and were recomputed."))
	hits, err4 := m.Int64ObservableCounter("sluice.config_cache.hits", metric.WithUnit("{lookup}"),
		metric.WithDescription("Limit lookups answered by the config cache."))
	misses, err5 := m.Int64ObservableCounter("sluice.config_cache.misses", metric.WithUnit("{lookup}"),
		metric.WithDescription("Limit lookups that read the table."))
	size, err6 := m.Int64ObservableGauge("sluice.config_cache.size", metric.WithUnit("{entry}"),
		metric.WithDescription("Buckets whose limits the config cache holds."))
	local, err7 := m.Int64ObservableCounter("sluice.dynamodb.local_answers", metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions answered from the last bucket state this replica saw, without a DynamoDB call of their own."))
	coalesced, err8 := m.Int64ObservableCounter("sluice.dynamodb.coalesced_decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions whose tokens were written by one write shared with another decision of the same bucket."))
	for _, err := range []error{err1, err2, err3, err4, err5, err6, err7, err8} {
		if err != nil {
			return err
		}
	}
	s := b.Stats()
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveFloat64(rcu, float64(s.ReadMilliUnits.Load())/1000)
		o.ObserveFloat64(wcu, float64(s.WriteMilliUnits.Load())/1000)
		o.ObserveInt64(retries, int64(s.ConditionRetries.Load()))
		o.ObserveInt64(hits, int64(s.CacheHits.Load()))
		o.ObserveInt64(misses, int64(s.CacheMisses.Load()))
		o.ObserveInt64(size, int64(b.ConfigCacheLen()))
		o.ObserveInt64(local, int64(s.LocalAnswers.Load()))
		o.ObserveInt64(coalesced, int64(s.Coalesced.Load()))
		return nil
	}, rcu, wcu, retries, hits, misses, size, local, coalesced)
	return err
}

// ObserveTLS reports the serving certificate when metrics are read: when
// it expires, and its reloads.
func (t *Telemetry) ObserveTLS(stats func() certs.Stats) error {
	expiry, err := t.meter.Int64ObservableGauge("sluice.tls.certificate.expiry", metric.WithUnit("s"),
		metric.WithDescription("When the serving certificate expires, in Unix seconds."))
	if err != nil {
		return err
	}
	reloads, err := t.meter.Int64ObservableCounter("sluice.tls.reloads", metric.WithUnit("{reload}"),
		metric.WithDescription("Loads of the TLS files, by result (ok, failed); the first load counts."))
	if err != nil {
		return err
	}
	_, err = t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := stats()
		o.ObserveInt64(expiry, s.NotAfter.Unix())
		o.ObserveInt64(reloads, int64(s.OK), metric.WithAttributes(attribute.String("result", "ok")))
		o.ObserveInt64(reloads, int64(s.Failed), metric.WithAttributes(attribute.String("result", "failed")))
		return nil
	}, expiry, reloads)
	return err
}

// ObserveAdmission reports the gRPC admission control when metrics are
// read: calls shed by reason, and calls in flight and queued now.
func (t *Telemetry) ObserveAdmission(stats func() admission.Stats) error {
	m := t.meter
	shed, err1 := m.Int64ObservableCounter("sluice.grpc.shed", metric.WithUnit("{call}"),
		metric.WithDescription("ShouldRateLimit calls shed before they ran, by reason (queue_full: refused with RESOURCE_EXHAUSTED; deadline: the caller's deadline passed, or it gave up, while queued)."))
	inFlight, err2 := m.Int64ObservableGauge("sluice.grpc.calls.in_flight", metric.WithUnit("{call}"),
		metric.WithDescription("ShouldRateLimit calls running now."))
	queued, err3 := m.Int64ObservableGauge("sluice.grpc.calls.queued", metric.WithUnit("{call}"),
		metric.WithDescription("ShouldRateLimit calls waiting now for one of those running to finish."))
	for _, err := range []error{err1, err2, err3} {
		if err != nil {
			return err
		}
	}
	full := metric.WithAttributes(attribute.String("reason", admission.ReasonQueueFull))
	deadline := metric.WithAttributes(attribute.String("reason", admission.ReasonDeadline))
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := stats()
		o.ObserveInt64(shed, int64(s.ShedQueueFull), full)
		o.ObserveInt64(shed, int64(s.ShedDeadline), deadline)
		o.ObserveInt64(inFlight, int64(s.InFlight))
		o.ObserveInt64(queued, int64(s.Queued))
		return nil
	}, shed, inFlight, queued)
	return err
}
