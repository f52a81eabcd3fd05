package telemetry

import (
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/ratelimit"
)

// ratelimitStats are the per-rule counters of envoyproxy/ratelimit under
// the Prometheus names its statsd mapping gives them, which the dashboards
// and alerts built for that service (Envoy Gateway's among them) read:
// ratelimit_service_rate_limit_{total_hits,within_limit,near_limit,
// over_limit,shadow_mode}, labelled domain, key1 and key2. They are
// client_golang counters on the registry directly, not OpenTelemetry
// instruments: the OpenTelemetry exporter would add _total to the names
// the dashboards query.
//
// The labels come from the rule's stats key (descriptors.Rule.StatsKey),
// cleaned as envoyproxy/ratelimit cleans it and split at its dots: a key
// of two parts is domain and key1, of three domain, key1 and key2 (key2
// empty, which Prometheus stores as no label, for two). Longer keys have
// no series, as Envoy Gateway's mapping drops them.
type ratelimitStats struct {
	totalHits, withinLimit, nearLimit, overLimit, shadowMode *prometheus.CounterVec

	// counters caches one series set per cleaned stats key: the lookup by
	// label values hashes them and boxes a slice on every call.
	mu       sync.RWMutex
	counters map[string]*statsCounters
}

type statsCounters struct {
	totalHits, withinLimit, nearLimit, overLimit, shadowMode prometheus.Counter
}

// maxStatsKeys bounds the series the counters hold. Stats keys name rules
// (bounded by the rule files) unless a rule opts into request values
// (value_to_metric, detailed_metric); past the bound, new keys are still
// counted but not cached.
const maxStatsKeys = 100_000

func newRatelimitStats(reg prometheus.Registerer) (*ratelimitStats, error) {
	labels := []string{"domain", "key1", "key2"}
	vec := func(stat, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_rate_limit_" + stat, Help: help}, labels)
	}
	s := &ratelimitStats{
		totalHits:   vec("total_hits", "Hits of limited descriptors (envoyproxy/ratelimit's name), by domain and stats key."),
		withinLimit: vec("within_limit", "Hits allowed (envoyproxy/ratelimit's name), by domain and stats key."),
		nearLimit:   vec("near_limit", "Hits allowed with less than 1 - near-limit-ratio of the burst left (envoyproxy/ratelimit's name), by domain and stats key."),
		overLimit:   vec("over_limit", "Hits over their limit, shadow mode or not (envoyproxy/ratelimit's name), by domain and stats key."),
		shadowMode:  vec("shadow_mode", "Hits over their limit answered OK by shadow mode (envoyproxy/ratelimit's name), by domain and stats key."),
		counters:    map[string]*statsCounters{},
	}
	for _, c := range []prometheus.Collector{s.totalHits, s.withinLimit, s.nearLimit, s.overLimit, s.shadowMode} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// observe counts one decided descriptor as envoyproxy/ratelimit counts
// it. Unmatched, unlimited and replaced descriptors have no limit there,
// and no counters. A denial is whole in Sluice, so all its hits are over
// the limit (envoyproxy/ratelimit's fixed windows can split them).
func (s *ratelimitStats) observe(d ratelimit.Decided) {
	switch d.Outcome {
	case ratelimit.OutcomeOK, ratelimit.OutcomeNearLimit, ratelimit.OutcomeOverLimit, ratelimit.OutcomeShadowOverLimit:
	default:
		return
	}
	c := s.lookup(d.Rule.StatsKey(d.Entries))
	if c == nil {
		return
	}
	hits := float64(d.Hits)
	c.totalHits.Add(hits)
	switch d.Outcome {
	case ratelimit.OutcomeOK:
		c.withinLimit.Add(hits)
	case ratelimit.OutcomeNearLimit:
		c.withinLimit.Add(hits)
		c.nearLimit.Add(hits)
	case ratelimit.OutcomeOverLimit:
		c.overLimit.Add(hits)
	case ratelimit.OutcomeShadowOverLimit:
		c.overLimit.Add(hits)
		c.shadowMode.Add(hits)
	}
}

func (s *ratelimitStats) lookup(key string) *statsCounters {
	key = cleanStatName(key)
	s.mu.RLock()
	c, ok := s.counters[key]
	s.mu.RUnlock()
	if ok {
		return c
	}
	domain, key1, key2, ok := statsLabels(key)
	if !ok {
		return nil
	}
	c = &statsCounters{
		totalHits:   s.totalHits.WithLabelValues(domain, key1, key2),
		withinLimit: s.withinLimit.WithLabelValues(domain, key1, key2),
		nearLimit:   s.nearLimit.WithLabelValues(domain, key1, key2),
		overLimit:   s.overLimit.WithLabelValues(domain, key1, key2),
		shadowMode:  s.shadowMode.WithLabelValues(domain, key1, key2),
	}
	s.mu.Lock()
	if len(s.counters) < maxStatsKeys {
		s.counters[key] = c
	}
	s.mu.Unlock()
	return c
}

// statsLabels splits a cleaned stats key as Envoy Gateway's statsd mapping
// splits the metric names built from it (ratelimit.service.rate_limit.
// <key>.<stat>, one label per dot-separated part): two parts are domain
// and key1, three domain, key1 and key2; other keys are not mapped.
func statsLabels(key string) (domain, key1, key2 string, ok bool) {
	domain, rest, ok := strings.Cut(key, ".")
	if !ok {
		return "", "", "", false
	}
	key1, key2, three := strings.Cut(rest, ".")
	if three && strings.Contains(key2, ".") {
		return "", "", "", false
	}
	return domain, key1, key2, true
}

// cleanStatName makes a stats key what envoyproxy/ratelimit emits: ':' and
// '|' become '_' (statsd's own separators), and so do the dots of an IPv4
// address, so that remote_address_10.1.2.3 stays one part of the name.
// It returns key itself when there is nothing to change.
func cleanStatName(key string) string {
	var b []byte // a copy, made at the first change
	set := func(i int) {
		if b == nil {
			b = []byte(key)
		}
		b[i] = '_'
	}
	for i := 0; i < len(key); {
		if c := key[i]; c == ':' || c == '|' {
			set(i)
			i++
			continue
		}
		n := ipv4At(key, i)
		if n == 0 {
			i++
			continue
		}
		for j := i; j < i+n; j++ {
			if key[j] == '.' {
				set(j)
			}
		}
		i += n
	}
	if b == nil {
		return key
	}
	return string(b)
}

// ipv4At returns the length of the dotted quad of one to three digits
// each that starts at s[i], or 0. Like the regular expression
// envoyproxy/ratelimit uses (four groups of one to three digits joined by
// dots, leftmost first, no look at what surrounds them), it takes up to
// three digits per group: fewer could never be followed by the dot.
func ipv4At(s string, i int) int {
	start := i
	for part := range 4 {
		if part > 0 {
			if i >= len(s) || s[i] != '.' {
				return 0
			}
			i++
		}
		n := 0
		for n < 3 && i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
			n++
		}
		if n == 0 {
			return 0
		}
	}
	return i - start
}
