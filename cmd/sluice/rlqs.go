package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/rlqs"
	"github.com/sluice-rl/sluice/telemetry"
)

// rlqsOptions are serve's flags for quota streams (docs/rlqs.md).
type rlqsOptions struct {
	ttl                    time.Duration
	maxStreams, maxBuckets int
}

// service builds the quota service over be, refusing flags that would
// mean something else than they say.
func (o rlqsOptions) service(rules rlqs.Rules, be backend.Backend, log *slog.Logger) (*rlqs.Service, error) {
	if o.ttl < time.Second || o.ttl%time.Second != 0 {
		return nil, usageError{fmt.Errorf("--rlqs-assignment-ttl %v: want whole seconds, at least 1s (Envoy keeps no finer TTL)", o.ttl)}
	}
	if o.maxStreams < 1 {
		return nil, usageError{fmt.Errorf("--rlqs-max-streams %d: want at least 1", o.maxStreams)}
	}
	if o.maxBuckets < 1 {
		return nil, usageError{fmt.Errorf("--rlqs-max-buckets %d: want at least 1", o.maxBuckets)}
	}
	return rlqs.New(rules, be, rlqs.Options{Policy: rlqs.Policy{TTL: o.ttl},
		MaxStreams: o.maxStreams, MaxBuckets: o.maxBuckets, Logger: log}), nil
}

// quotaStats is what the metrics read of the quota streams.
func (s *server) quotaStats() telemetry.QuotaStats {
	st := s.quota.Stats()
	return telemetry.QuotaStats{Streams: st.Streams, Buckets: st.Buckets,
		TokenBuckets: st.TokenBuckets, DenyAll: st.DenyAll, AllowAll: st.AllowAll, Abandoned: st.Abandoned,
		Leased: st.Leased, Stranded: st.Stranded, Returned: st.Returned, Refused: st.Refused, BackendErrors: st.BackendErrors}
}
