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
	// Zipf draws key k (k = 1 ... Keys, the value suffixed "-<k-1>") with
	// probability proportional to k^-ZipfS: a few busy keys and a long
	// tail, the usual shape of real traffic.
	Zipf
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
	case Zipf:
		return "zipf"
	}
	return "Distribution(" + strconv.Itoa(int(d)) + ")"
}

// ParseDistribution parses "fixed", "uniform", "hot" or "zipf".
func ParseDistribution(s string) (Distribution, error) {
	for d := Fixed; d <= Zipf; d++ {
		if strings.EqualFold(s, d.String()) {
			return d, nil
		}
	}
	return 0, fmt.Errorf("unknown distribution %q (want fixed, uniform, hot or zipf)", s)
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

// ProbeKey is the descriptor key of the call Run makes on each
// connection before the clock starts: no rule should match it, so that
// the call reaches no backend and touches none of the workload's
// buckets.
const ProbeKey = "sluice_bench_probe"

// Defaults for zero Workload fields.
const (
	// DefaultHotFraction is the share of the hot key for Hot.
	DefaultHotFraction = 0.9
	// DefaultZipfS is the Zipf exponent: with 1000 keys the hottest
	// takes about 18% of the calls and the top 10 about half.
	DefaultZipfS = 1.1
)

// Workload describes the requests a load run sends: each carries Domain
// and one descriptor made of Entries. With more than one key, the last
// entry's value is suffixed "-0" ... "-<Keys-1>", one value per key.
//
// A share OverFraction of the calls carries the descriptor Over instead,
// always with the same value: the operator's rules give it a tiny limit,
// so that those calls are denied and the denial path is measured in the
// same run as the allowed one.
type Workload struct {
	Domain  string
	Entries []Entry
	Dist    Distribution
	// Keys is the number of distinct values for Uniform, Hot and Zipf;
	// Fixed (and Keys <= 1) sends the last entry's value unchanged.
	Keys int
	// HotFraction is, for Hot, the share of requests sent to the hot key;
	// zero means DefaultHotFraction.
	HotFraction float64
	// ZipfS is, for Zipf, the exponent, above 1; zero means DefaultZipfS.
	ZipfS float64
	// Over is the descriptor of the over-limit calls; it is required when
	// OverFraction is positive.
	Over []Entry
	// OverFraction is the share of calls, from 0 to 1, that carry Over.
	OverFraction float64
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
	reqs  []*rlsv3.RateLimitRequest
	dist  Distribution
	hot   float64
	zipfS float64
	// over is sent instead of reqs with probability overFraction.
	over         *rlsv3.RateLimitRequest
	overFraction float64
	// probe is the connection check's request (ProbeKey), in the
	// workload's domain.
	probe *rlsv3.RateLimitRequest
}

func (w Workload) build() (*requestSet, error) {
	switch {
	case w.Domain == "":
		return nil, errors.New("workload: empty domain")
	case len(w.Entries) == 0:
		return nil, errors.New("workload: no descriptor entries")
	case w.HotFraction < 0 || w.HotFraction > 1:
		return nil, fmt.Errorf("workload: hot fraction %v out of [0, 1]", w.HotFraction)
	case w.ZipfS != 0 && !(w.ZipfS > 1):
		return nil, fmt.Errorf("workload: zipf exponent %v: want more than 1", w.ZipfS)
	case w.OverFraction < 0 || w.OverFraction > 1:
		return nil, fmt.Errorf("workload: over-limit fraction %v out of [0, 1]", w.OverFraction)
	case w.OverFraction > 0 && len(w.Over) == 0:
		return nil, errors.New("workload: over-limit calls without an over-limit descriptor")
	case w.Dist < Fixed || w.Dist > Zipf:
		return nil, fmt.Errorf("workload: %v", w.Dist)
	}
	n := 1
	if w.Dist != Fixed {
		n = max(w.Keys, 1)
	}
	rs := &requestSet{
		reqs: make([]*rlsv3.RateLimitRequest, n), dist: w.Dist,
		hot: w.HotFraction, zipfS: w.ZipfS, overFraction: w.OverFraction,
		probe: request(w.Domain, []Entry{{ProbeKey, "x"}}, ""),
	}
	if rs.hot == 0 {
		rs.hot = DefaultHotFraction
	}
	if rs.zipfS == 0 {
		rs.zipfS = DefaultZipfS
	}
	if n == 1 {
		rs.dist = Fixed
	}
	for i := range rs.reqs {
		suffix := ""
		if n > 1 {
			suffix = "-" + strconv.Itoa(i)
		}
		rs.reqs[i] = request(w.Domain, w.Entries, suffix)
	}
	if w.OverFraction > 0 {
		rs.over = request(w.Domain, w.Over, "")
	}
	return rs, nil
}

// request is a one-descriptor request whose last entry's value has suffix
// appended.
func request(domain string, es []Entry, suffix string) *rlsv3.RateLimitRequest {
	entries := make([]*rlv3.RateLimitDescriptor_Entry, len(es))
	for i, e := range es {
		entries[i] = &rlv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value}
	}
	entries[len(entries)-1].Value += suffix
	return &rlsv3.RateLimitRequest{
		Domain:      domain,
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: entries}},
	}
}

// picker draws the requests of one worker. Each worker has its own, so
// that the hot loop shares nothing and allocates nothing, and its
// sequence follows from its seed alone.
type picker struct {
	rs   *requestSet
	rng  *rand.Rand
	zipf *rand.Zipf // for Zipf only; draws from rng
}

func (rs *requestSet) picker(seed uint64) *picker {
	p := &picker{rs: rs, rng: rand.New(rand.NewPCG(seed, 0x5eed))}
	if rs.dist == Zipf {
		// v = 1 makes P(k) proportional to (1+k)^-s for k = 0 ... n-1:
		// rank k+1 of a Zipf law, rank 1 (reqs[0]) the hottest.
		p.zipf = rand.NewZipf(p.rng, rs.zipfS, 1, uint64(len(rs.reqs)-1))
	}
	return p
}

// next returns the worker's next request.
func (p *picker) next() *rlsv3.RateLimitRequest {
	rs := p.rs
	if rs.over != nil && p.rng.Float64() < rs.overFraction {
		return rs.over
	}
	switch rs.dist {
	case Uniform:
		return rs.reqs[p.rng.IntN(len(rs.reqs))]
	case Hot:
		if p.rng.Float64() < rs.hot {
			return rs.reqs[0]
		}
		return rs.reqs[1+p.rng.IntN(len(rs.reqs)-1)]
	case Zipf:
		return rs.reqs[p.zipf.Uint64()]
	}
	return rs.reqs[0]
}
