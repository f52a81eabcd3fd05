package telemetry

import (
	"context"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-rl/sluice/admission"
	"github.com/sluice-rl/sluice/backend"
	sluiceddb "github.com/sluice-rl/sluice/backend/dynamodb"
	"github.com/sluice-rl/sluice/backend/redis"
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
// needed no call or shared a write, the leases, and the config cache.
func (t *Telemetry) ObserveDynamoDB(b *sluiceddb.Backend) error {
	m := t.meter
	rcu, err1 := m.Float64ObservableCounter("sluice.dynamodb.read_capacity_units", metric.WithUnit("{unit}"),
		metric.WithDescription("Read capacity units DynamoDB reported consumed."))
	wcu, err2 := m.Float64ObservableCounter("sluice.dynamodb.write_capacity_units", metric.WithUnit("{unit}"),
		metric.WithDescription("Write capacity units DynamoDB reported consumed."))
	retries, err3 := m.Int64ObservableCounter("sluice.dynamodb.condition_retries", metric.WithUnit("{write}"),
		metric.WithDescription("Bucket writes that lost a race to another writer and were recomputed."))
	local, err7 := m.Int64ObservableCounter("sluice.dynamodb.local_answers", metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions answered without a DynamoDB call of their own: admissions paid from a lease, and denials and checks answered from the last bucket state this replica saw."))
	coalesced, err8 := m.Int64ObservableCounter("sluice.dynamodb.coalesced_decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions whose tokens were written by one write shared with another decision of the same bucket."))
	contended, err12 := m.Int64ObservableCounter("sluice.dynamodb.contended_denials", metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions denied because their write lost every race on a bucket near its limit: other replicas took its last tokens first."))
	guesses, err13 := m.Int64ObservableCounter("sluice.dynamodb.first_guesses", metric.WithUnit("{decision}"),
		metric.WithDescription("Key's first decisions on this replica made on the limits its records were guessed to give, while they were read: outcome=right, or outcome=wrong (the records said otherwise and the call was decided again)."))
	for _, err := range []error{err1, err2, err3, err7, err8, err12, err13} {
		if err != nil {
			return err
		}
	}
	s := b.Stats()
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveFloat64(rcu, float64(s.ReadMilliUnits.Load())/1000)
		o.ObserveFloat64(wcu, float64(s.WriteMilliUnits.Load())/1000)
		o.ObserveInt64(retries, int64(s.ConditionRetries.Load()))
		o.ObserveInt64(local, int64(s.LocalAnswers.Load()))
		o.ObserveInt64(coalesced, int64(s.Coalesced.Load()))
		o.ObserveInt64(contended, int64(s.Contended.Load()))
		o.ObserveInt64(guesses, int64(s.GuessesRight.Load()), metric.WithAttributes(attribute.String("outcome", "right")))
		o.ObserveInt64(guesses, int64(s.GuessesWrong.Load()), metric.WithAttributes(attribute.String("outcome", "wrong")))
		return nil
	}, rcu, wcu, retries, local, coalesced, contended, guesses)
	if err != nil {
		return err
	}
	if err := t.observeLeases("dynamodb", "Bucket writes", "the table's", &s.LeaseStats); err != nil {
		return err
	}
	return t.observeConfigCache(&s.CacheHits, &s.CacheMisses, b.ConfigCacheLen)
}

// observeLeases reports a backend's leases (backend.LeaseStats) as
// sluice.<store>.lease_tokens, lease_tokens_outstanding, lease_writes and
// deadline_denials; writes names what moves lease tokens in that store,
// and whose, whose round trip it is.
func (t *Telemetry) observeLeases(store, writes, whose string, s *backend.LeaseStats) error {
	m := t.meter
	tokens, err1 := m.Float64ObservableCounter("sluice."+store+".lease_tokens", metric.WithUnit("{token}"),
		metric.WithDescription("Tokens moved into this replica's leases (event=leased), back into their buckets (returned), lost on the way (dropped: a write whose outcome is unknown, a limit removed), or given back to a bucket that had refilled to its burst meanwhile and could not hold them (cut)."))
	outstanding, err2 := m.Float64ObservableGauge("sluice."+store+".lease_tokens_outstanding", metric.WithUnit("{token}"),
		metric.WithDescription("Tokens this replica's leases hold now: taken from their buckets, not yet spent or returned."))
	moves, err3 := m.Int64ObservableCounter("sluice."+store+".lease_writes", metric.WithUnit("{write}"),
		metric.WithDescription(writes+" that granted lease tokens or gave them back."))
	deadline, err4 := m.Int64ObservableCounter("sluice."+store+".deadline_denials", metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions denied without "+whose+" answer, their deadline come or nearer than its round trip, while this replica's lease was spent with a grant on the way or could not last a round trip of its demand: a store farther than the caller's deadline, at or near the limit."))
	for _, err := range []error{err1, err2, err3, err4} {
		if err != nil {
			return err
		}
	}
	leased := metric.WithAttributes(attribute.String("event", "leased"))
	returned := metric.WithAttributes(attribute.String("event", "returned"))
	dropped := metric.WithAttributes(attribute.String("event", "dropped"))
	cut := metric.WithAttributes(attribute.String("event", "cut"))
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveFloat64(tokens, float64(s.LeaseCut.Load())/1000, cut)
		o.ObserveFloat64(tokens, float64(s.Leased.Load())/1000, leased)
		o.ObserveFloat64(tokens, float64(s.Returned.Load())/1000, returned)
		o.ObserveFloat64(tokens, float64(s.LeaseDropped.Load())/1000, dropped)
		o.ObserveFloat64(outstanding, float64(s.LeaseOutstanding.Load())/1000)
		o.ObserveInt64(moves, int64(s.LeaseWrites.Load()))
		o.ObserveInt64(deadline, int64(s.DeadlineDenials.Load()))
		return nil
	}, tokens, outstanding, moves, deadline)
	return err
}

// ObserveRedis reports the Redis backend's running totals when metrics
// are read: its config cache, as for DynamoDB, and its leases when they
// are on (the round trips are timed by RedisCall).
func (t *Telemetry) ObserveRedis(b *redis.Backend) error {
	s := b.Stats()
	if b.LeaseHorizon() > 0 {
		local, err := t.meter.Int64ObservableCounter("sluice.redis.local_answers", metric.WithUnit("{decision}"),
			metric.WithDescription("Decisions answered without a run of the script of their own: admissions paid from this replica's lease, and denials decided from the bucket it saw within the last second and its lease."))
		if err != nil {
			return err
		}
		if _, err := t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			o.ObserveInt64(local, int64(s.LocalAnswers.Load()))
			return nil
		}, local); err != nil {
			return err
		}
		if err := t.observeLeases("redis", "Runs of the decision script", "Redis's", &s.LeaseStats); err != nil {
			return err
		}
	}
	return t.observeConfigCache(&s.CacheHits, &s.CacheMisses, b.ConfigCacheLen)
}

// observeConfigCache reports a backend's config cache: lookups answered
// from it and those that read the store, and how many buckets it holds.
func (t *Telemetry) observeConfigCache(hitsN, missesN *atomic.Uint64, sizeN func() int) error {
	m := t.meter
	hits, err1 := m.Int64ObservableCounter("sluice.config_cache.hits", metric.WithUnit("{lookup}"),
		metric.WithDescription("Limit lookups answered by the config cache."))
	misses, err2 := m.Int64ObservableCounter("sluice.config_cache.misses", metric.WithUnit("{lookup}"),
		metric.WithDescription("Limit lookups that read the table."))
	size, err3 := m.Int64ObservableGauge("sluice.config_cache.size", metric.WithUnit("{entry}"),
		metric.WithDescription("Buckets whose limits the config cache holds."))
	for _, err := range []error{err1, err2, err3} {
		if err != nil {
			return err
		}
	}
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(hits, int64(hitsN.Load()))
		o.ObserveInt64(misses, int64(missesN.Load()))
		o.ObserveInt64(size, int64(sizeN()))
		return nil
	}, hits, misses, size)
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
