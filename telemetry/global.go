package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-rl/sluice/backend"
)

// ObserveMoving reports a replica's usage reports when its global shares
// move (backend.Moving): sluice_global_usage_reports_total{result} and
// sluice_global_usage_dropped_total.
func (t *Telemetry) ObserveMoving(stats func() backend.MovingStats) error {
	reports, err1 := t.meter.Int64ObservableCounter("sluice.global.usage_reports", metric.WithUnit("{window}"),
		metric.WithDescription("Windows whose usage of global keys this replica wrote to its region's store (result=written), or lost to a failed write (failed)."))
	dropped, err2 := t.meter.Int64ObservableCounter("sluice.global.usage_dropped", metric.WithUnit("{request}"),
		metric.WithDescription("Requests of global keys left out of this replica's usage: their window already held as many keys as its config cache (100,000)."))
	for _, err := range []error{err1, err2} {
		if err != nil {
			return err
		}
	}
	written := metric.WithAttributes(attribute.String("result", "written"))
	failed := metric.WithAttributes(attribute.String("result", "failed"))
	_, err := t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := stats()
		o.ObserveInt64(reports, int64(s.Written), written)
		o.ObserveInt64(reports, int64(s.Failed), failed)
		o.ObserveInt64(dropped, s.Dropped)
		return nil
	}, reports, dropped)
	return err
}

// SyncStats are a region's sync's totals and its last round, as
// ObserveSync reads them.
type SyncStats struct {
	// Rounds counts the windows synced, Writes the share records
	// written (each moves share).
	Rounds, Writes uint64
	// Errors counts what a round could not read (kind unread), the loans
	// it refused to copy (refused) and the keys whose step stopped
	// (failed).
	Unread, Refused, Failed uint64
	// Keys is how many keys the last round planned, Seconds how long it
	// took.
	Keys    int
	Seconds float64
	// Top are the last round's busiest keys, for per-key gauges.
	Top []KeyShares
}

// KeyShares is one global key as the last round saw it in each region:
// its share and its demand, as fractions of the limit.
type KeyShares struct {
	Entity, Resource string
	Share, Demand    map[string]float64
}

// ObserveSync reports a region's sync: sluice_sync_rounds_total,
// sluice_sync_writes_total, sluice_sync_errors_total{kind},
// sluice_sync_keys, sluice_sync_round_seconds, and for the busiest keys
// sluice_global_share and sluice_global_demand{entity,resource,region}.
func (t *Telemetry) ObserveSync(stats func() SyncStats) error {
	m := t.meter
	rounds, err1 := m.Int64ObservableCounter("sluice.sync.rounds", metric.WithUnit("{round}"),
		metric.WithDescription("Windows this sync planned."))
	writes, err2 := m.Int64ObservableCounter("sluice.sync.writes", metric.WithUnit("{write}"),
		metric.WithDescription("Share records this sync wrote to its region's store: each moves share between regions."))
	errs, err3 := m.Int64ObservableCounter("sluice.sync.errors", metric.WithUnit("{error}"),
		metric.WithDescription("What went wrong in this sync's rounds: kind=unread (a region's usage or record), refused (a loan it would not copy), failed (a key whose write failed or lost its condition)."))
	keys, err4 := m.Int64ObservableGauge("sluice.sync.keys", metric.WithUnit("{key}"),
		metric.WithDescription("Global keys the last round planned: those any region was asked for in the window before."))
	secs, err5 := m.Float64ObservableGauge("sluice.sync.round", metric.WithUnit("s"),
		metric.WithDescription("How long the last round took."))
	share, err6 := m.Float64ObservableGauge("sluice.global.share",
		metric.WithDescription("The part of a global key's limit each region holds in the window under way, as the last round read its records; for the busiest keys only (--metrics-keys)."))
	demand, err7 := m.Float64ObservableGauge("sluice.global.demand",
		metric.WithDescription("What each region was asked of a global key over the window before, as a part of its limit's rate; for the busiest keys only (--metrics-keys)."))
	for _, err := range []error{err1, err2, err3, err4, err5, err6, err7} {
		if err != nil {
			return err
		}
	}
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := stats()
		o.ObserveInt64(rounds, int64(s.Rounds))
		o.ObserveInt64(writes, int64(s.Writes))
		o.ObserveInt64(errs, int64(s.Unread), metric.WithAttributes(attribute.String("kind", "unread")))
		o.ObserveInt64(errs, int64(s.Refused), metric.WithAttributes(attribute.String("kind", "refused")))
		o.ObserveInt64(errs, int64(s.Failed), metric.WithAttributes(attribute.String("kind", "failed")))
		o.ObserveInt64(keys, int64(s.Keys))
		o.ObserveFloat64(secs, s.Seconds)
		for _, k := range s.Top {
			for region, v := range k.Share {
				o.ObserveFloat64(share, v, metric.WithAttributes(attribute.String("entity", k.Entity),
					attribute.String("resource", k.Resource), attribute.String("region", region)))
			}
			for region, v := range k.Demand {
				o.ObserveFloat64(demand, v, metric.WithAttributes(attribute.String("entity", k.Entity),
					attribute.String("resource", k.Resource), attribute.String("region", region)))
			}
		}
		return nil
	}, rounds, writes, errs, keys, secs, share, demand)
	return err
}
