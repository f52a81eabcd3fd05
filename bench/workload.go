package bench

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// Distribution is how a Workload spreads requests over its keys.
type Distribution int

const (
	// Fixed sends every request with the same descriptor value.
	Fixed Distribution = iota
	// Uniform draws the value uniformly from Keys values.
	Uniform
	// Hot sends HotFraction of the requests to one value and spreads the
	// rest uniformly over the other Keys-1: the skew of one busy tenant.
	Hot
)

// String returns the name ParseDistribution takes.
func (d Distribution) String() string {
	switch d {
	case Fixed:
		return "fixed"
	case Uniform:
		return "uniform"
	case Hot:
		return "hot"
	}
	return "Distribution(" + strconv.Itoa(int(d)) + ")"
}

// ParseDistribution parses "fixed", "uniform" or "hot".
func ParseDistribution(s string) (Distribution, error) {
	for _, d := range []Distribution{Fixed, Uniform, Hot} {
		if strings.EqualFold(s, d.String()) {
			return d, nil
		}
	}
	return 0, fmt.Errorf("unknown distribution %q (want fixed, uniform or hot)", s)
}

// Entry is one key/value entry of a descriptor.
type Entry struct{ Key, Value string }

// ParseEntry parses "key=value".
func ParseEntry(s string) (Entry, error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return Entry{}, fmt.Errorf("descriptor entry %q: want key=value", s)
	}
	return Entry{Key: k, Value: v}, nil
}

// DefaultHotFraction is the share of the hot key when Workload.HotFraction
// is zero.
const DefaultHotFraction = 0.9

// Workload describes the requests a load run sends: each carries Domain
// and one descriptor made of Entries. With more than one key, the last
// entry's value is suffixed "-0" ... "-<Keys-1>", one value per key.
type Workload struct {
	Domain  string
	Entries []Entry
	Dist    Distribution
	// Keys is the number of distinct values for Uniform and Hot; Fixed
	// (and Keys <= 1) sends the last entry's value unchanged.
	Keys int
	// HotFraction is, for Hot, the share of requests sent to the hot key;
	// zero means DefaultHotFraction.
	HotFraction float64
}

// SingleKey is the workload of the requirement: one descriptor, one fixed
// value, on RulesYAML's rule.
func SingleKey() Workload {
	return Workload{Domain: Domain, Entries: []Entry{{Key, "k"}}, Dist: Fixed}
}

// requestSet is a Workload's requests, built once before a run so that
// building them costs the measurement nothing. The requests are shared by
// every worker and never modified, which makes concurrent marshalling
// safe.
type requestSet struct {
	reqs []*rlsv3.RateLimitRequest
	dist Distribution
	hot  float64
}

func (w Workload) build() (*requestSet, error) {
	switch {
	case w.Domain == "":
		return nil, errors.New("workload: empty domain")
	case len(w.Entries) == 0:
		return nil, errors.New("workload: no descriptor entries")
	case w.HotFraction < 0 || w.HotFraction > 1:
		return nil, fmt.Errorf("workload: hot fraction %v out of [0, 1]", w.HotFraction)
	case w.Dist < Fixed || w.Dist > Hot:
		return nil, fmt.Errorf("workload: %v", w.Dist)
	}
	n := 1
	if w.Dist != Fixed {
		n = max(w.Keys, 1)
	}
	rs := &requestSet{reqs: make([]*rlsv3.RateLimitRequest, n), dist: w.Dist, hot: w.HotFraction}
	if rs.hot == 0 {
		rs.hot = DefaultHotFraction
	}
	if n == 1 {
		rs.dist = Fixed
	}
	for i := range rs.reqs {
		entries := make([]*rlv3.RateLimitDescriptor_Entry, len(w.Entries))
		for j, e := range w.Entries {
			entries[j] = &rlv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value}
		}
		if n > 1 {
			last := entries[len(entries)-1]
			last.Value += "-" + strconv.Itoa(i)
		}
		rs.reqs[i] = &rlsv3.RateLimitRequest{
			Domain:      w.Domain,
			Descriptors: []*rlv3.RateLimitDescriptor{{Entries: entries}},
		}
	}
	return rs, nil
}

// pick returns the next request; rng belongs to the calling worker.
func (rs *requestSet) pick(rng *rand.Rand) *rlsv3.RateLimitRequest {
	switch rs.dist {
	case Uniform:
		return rs.reqs[rng.IntN(len(rs.reqs))]
	case Hot:
		if rng.Float64() < rs.hot {
			return rs.reqs[0]
		}
		return rs.reqs[1+rng.IntN(len(rs.reqs)-1)]
	}
	return rs.reqs[0]
}
