package ratelimit

import (
	"math"
	"math/bits"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/descriptors"
)

// fillStatus writes a limited decision into st: the code, the binding
// limit, whole tokens remaining and the time until reset.
func fillStatus(st *rlsv3.RateLimitResponse_DescriptorStatus, d backend.Decision, rule *descriptors.Rule) {
	l, r := d.Limits[d.Binding], d.Results[d.Binding]
	if !d.Allowed {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	rpu, unit := perUnit(l.Amount, l.Period)
	st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{
		Name:            rule.ReportedName(l.Name),
		RequestsPerUnit: rpu,
		Unit:            unit,
	}
	st.LimitRemaining = uint32(min(max(r.Tokens, 0)/bucket.Milli, math.MaxUint32))
	wait := r.Wait
	if wait == bucket.Never {
		// Nothing will ever pass (a cost over the burst, or a limit that
		// never refills): ask Envoy to come back after one period.
		wait = l.Period
	}
	st.DurationUntilReset = &durationpb.Duration{Seconds: ceilSeconds(wait)}
}

type envoyUnit struct {
	ms   int64
	unit rlsv3.RateLimitResponse_RateLimit_Unit
}

// envoyUnits lists Envoy's units in ascending length.
func envoyUnits() [7]envoyUnit {
	return [...]envoyUnit{
		{bucket.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
		{bucket.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{bucket.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{bucket.Day, rlsv3.RateLimitResponse_RateLimit_DAY},
		{bucket.Week, rlsv3.RateLimitResponse_RateLimit_WEEK},
		{bucket.Month, rlsv3.RateLimitResponse_RateLimit_MONTH},
		{bucket.Year, rlsv3.RateLimitResponse_RateLimit_YEAR},
	}
}

// perUnit expresses a rate in Envoy's terms: per its own period when that
// is a unit, else per the smallest longer unit, rounded down (5/10s is 30
// per MINUTE). A period over a year is expressed per year.
func perUnit(amount, period int64) (uint32, rlsv3.RateLimitResponse_RateLimit_Unit) {
	units := envoyUnits()
	u := units[len(units)-1]
	for _, c := range units {
		if c.ms >= period {
			u = c
			break
		}
	}
	hi, lo := bits.Mul64(uint64(amount), uint64(u.ms))
	if hi >= uint64(period) {
		return math.MaxUint32, u.unit
	}
	q, _ := bits.Div64(hi, lo, uint64(period))
	return uint32(min(q/bucket.Milli, math.MaxUint32)), u.unit
}

func ceilSeconds(ms int64) int64 {
	if ms <= 0 {
		return 0
	}
	return (ms + 999) / 1000
}

// headerState tracks the most constraining limited descriptor of a
// response, for the optional RateLimit-* headers: an over-limit one
// first, then the fewest remaining.
type headerState struct {
	st *rlsv3.RateLimitResponse_DescriptorStatus
}

func (h *headerState) observe(st *rlsv3.RateLimitResponse_DescriptorStatus) {
	if st.CurrentLimit == nil {
		return
	}
	switch {
	case h.st == nil:
		h.st = st
	case (st.Code == rlsv3.RateLimitResponse_OVER_LIMIT) != (h.st.Code == rlsv3.RateLimitResponse_OVER_LIMIT):
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			h.st = st
		}
	case st.LimitRemaining < h.st.LimitRemaining:
		h.st = st
	}
}

func (h *headerState) headers() []*corev3.HeaderValue {
	if h.st == nil {
		return nil
	}
	return []*corev3.HeaderValue{
		{Key: "RateLimit-Limit", Value: strconv.FormatUint(uint64(h.st.CurrentLimit.RequestsPerUnit), 10)},
		{Key: "RateLimit-Remaining", Value: strconv.FormatUint(uint64(h.st.LimitRemaining), 10)},
		{Key: "RateLimit-Reset", Value: strconv.FormatInt(h.st.DurationUntilReset.GetSeconds(), 10)},
	}
}
