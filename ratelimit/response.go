package ratelimit

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"

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

// headerState gathers what the optional rate-limit headers of a response
// say: the most constraining limited descriptor (an over-limit one
// first, then the fewest remaining), for RateLimit-Limit, -Remaining and
// -Reset; and every named limit of every limited descriptor, for the
// IETF fields RateLimit-Policy and RateLimit, one item per name.
type headerState struct {
	st    *rlsv3.RateLimitResponse_DescriptorStatus
	items []headerItem
}

// headerItem is one limit in RateLimit-Policy (q per w seconds) and in
// RateLimit (r left, t seconds until the limit resets or, when it denied,
// until the request could pass).
type headerItem struct {
	name   string
	q, r   uint64
	w, t   int64
	denied bool
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

// limits records every limit of d, a limited decision under rule: a name
// two descriptors share keeps the more constraining of the two (the one
// that denied, else the fewer left), so that a client backs off by the
// limit that holds it back. enforced is false in shadow mode, where
// nothing is denied.
func (h *headerState) limits(d backend.Decision, rule *descriptors.Rule, enforced bool) {
	for i, l := range d.Limits {
		r := d.Results[i]
		name := rule.ReportedName(l.Name)
		if name == "" {
			name = l.Name
		}
		wait := r.Wait
		if wait == bucket.Never {
			wait = l.Period
		}
		it := headerItem{name: name, q: uint64(l.Amount / bucket.Milli), w: max(ceilSeconds(l.Period), 1),
			r: uint64(max(r.Tokens, 0) / bucket.Milli), t: ceilSeconds(wait), denied: enforced && !r.Allowed}
		j := slices.IndexFunc(h.items, func(x headerItem) bool { return x.name == name })
		switch {
		case j < 0:
			h.items = append(h.items, it)
		case it.denied && !h.items[j].denied, it.denied == h.items[j].denied && it.r < h.items[j].r:
			h.items[j] = it
		}
	}
}

func (h *headerState) headers() []*corev3.HeaderValue {
	if h.st == nil {
		return nil
	}
	out := []*corev3.HeaderValue{
		{Key: "RateLimit-Limit", Value: strconv.FormatUint(uint64(h.st.CurrentLimit.RequestsPerUnit), 10)},
		{Key: "RateLimit-Remaining", Value: strconv.FormatUint(uint64(h.st.LimitRemaining), 10)},
		{Key: "RateLimit-Reset", Value: strconv.FormatInt(h.st.DurationUntilReset.GetSeconds(), 10)},
	}
	// The limits that denied come first: a client that reads only the
	// first item backs off by the one that holds it back.
	items := slices.Clone(h.items)
	slices.SortStableFunc(items, func(a, b headerItem) int {
		switch {
		case a.denied == b.denied:
			return 0
		case a.denied:
			return -1
		}
		return 1
	})
	var policy, state []string
	for _, it := range items {
		name, ok := sfString(it.name)
		if !ok {
			continue
		}
		policy = append(policy, fmt.Sprintf("%s;q=%d;w=%d", name, it.q, it.w))
		state = append(state, fmt.Sprintf("%s;r=%d;t=%d", name, it.r, it.t))
	}
	if len(policy) > 0 {
		out = append(out,
			&corev3.HeaderValue{Key: "RateLimit-Policy", Value: strings.Join(policy, ", ")},
			&corev3.HeaderValue{Key: "RateLimit", Value: strings.Join(state, ", ")})
	}
	return out
}

// sfString writes s as a structured-field string (RFC 8941): quoted, with
// '"' and '\' escaped; ok is false for a name with a character outside
// printable ASCII, which the format cannot carry.
func sfString(s string) (string, bool) {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e {
			return "", false
		}
		if c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	b.WriteByte('"')
	return b.String(), true
}
