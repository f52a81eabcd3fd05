package descriptors

import (
	"math"
	"reflect"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/descriptors/corpustest"
)

// Every rule file of the corpus that a RateLimitConfig resource can say
// (Envoy Gateway's dumps among them) reads the same over xDS as from its
// file: the same rules, in the same order, with the same limits, flags,
// names, replaces and metadata.
func TestRateLimitConfigsReadAsTheirFiles(t *testing.T) {
	dir := corpustest.Dir(t)
	compared := 0
	for _, f := range corpustest.Files(t, dir) {
		if f.Valid != "yes" {
			continue
		}
		files := corpustest.Read(t, dir, f.Name)
		var data []byte
		for _, d := range files {
			data = d
		}
		res, ok := corpustest.RateLimitConfig(t, data)
		if !ok {
			continue
		}
		want, err := Parse(files)
		if err != nil {
			t.Fatal(err)
		}
		got, err := FromRateLimitConfigs([]*rlconfv3.RateLimitConfig{res})
		if err != nil {
			t.Errorf("%s over xDS: %v", f.Name, err)
			continue
		}
		compared++
		if !reflect.DeepEqual(got.Domains(), want.Domains()) || got.Name(res.GetDomain()) != want.Name(res.GetDomain()) {
			t.Errorf("%s: domains %v (%q), from the file %v (%q)", f.Name, got.Domains(), got.Name(res.GetDomain()), want.Domains(), want.Name(res.GetDomain()))
		}
		gr, wr := got.Rules(), want.Rules()
		if len(gr) != len(wr) {
			t.Errorf("%s: %d rules over xDS, %d from the file", f.Name, len(gr), len(wr))
			continue
		}
		for i := range gr {
			if a, b := ruleSummary(gr[i]), ruleSummary(wr[i]); !reflect.DeepEqual(a, b) {
				t.Errorf("%s: rule %d over xDS %+v, from the file %+v", f.Name, i, a, b)
			}
		}
	}
	t.Logf("%d corpus files compared", compared)
	if compared < 40 {
		t.Errorf("only %d files compared", compared)
	}
}

// ruleSummary is what a rule says, without where it was written.
func ruleSummary(r *Rule) map[string]any {
	return map[string]any{"path": r.Path, "name": r.Name, "limits": r.Limits, "unlimited": r.Unlimited,
		"shadow": r.ShadowMode, "quota": r.QuotaMode, "detailed": r.DetailedMetric, "replaces": r.Replaces,
		"metadata": r.Metadata}
}

// A snapshot that would not load as a file is refused with an error that
// names the resource and what is wrong with it.
func TestRateLimitConfigsRefused(t *testing.T) {
	limited := func(key string, unit rlconfv3.RateLimitUnit, rpu uint32) *rlconfv3.RateLimitDescriptor {
		return &rlconfv3.RateLimitDescriptor{Key: key, RateLimit: &rlconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: rpu}}
	}
	for _, c := range []struct {
		name string
		cfgs []*rlconfv3.RateLimitConfig
		want []string
	}{
		{"empty domain", []*rlconfv3.RateLimitConfig{{Name: "gw"}}, []string{"xds:gw", "empty domain"}},
		{"duplicate domain", []*rlconfv3.RateLimitConfig{{Name: "a", Domain: "d"}, {Name: "b", Domain: "d"}},
			[]string{"xds:b", `duplicate domain "d"`, "xds:a"}},
		{"unit unknown", []*rlconfv3.RateLimitConfig{{Name: "gw", Domain: "d",
			Descriptors: []*rlconfv3.RateLimitDescriptor{limited("k", rlconfv3.RateLimitUnit_UNKNOWN, 5)}}},
			[]string{"xds:gw", `invalid unit "unknown"`}},
		{"empty key", []*rlconfv3.RateLimitConfig{{Name: "gw", Domain: "d",
			Descriptors: []*rlconfv3.RateLimitDescriptor{limited("", rlconfv3.RateLimitUnit_SECOND, 5)}}},
			[]string{"xds:gw", "empty key"}},
		{"duplicate descriptor", []*rlconfv3.RateLimitConfig{{Name: "gw", Domain: "d",
			Descriptors: []*rlconfv3.RateLimitDescriptor{limited("k", rlconfv3.RateLimitUnit_SECOND, 5), limited("k", rlconfv3.RateLimitUnit_MINUTE, 5)}}},
			[]string{"xds:gw", `duplicate descriptor: key "k"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := FromRateLimitConfigs(c.cfgs)
			if err == nil {
				t.Fatalf("loaded: %v", cfg.Domains())
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// No requests_per_unit a resource can carry is absurd to Sluice: the
// field is 32 bits, and a token bucket holds up to 2^40 tokens, so every
// value, from 0 (deny everything) to 4294967295 a second or a year,
// loads and decides exactly. (Out of range in a rule file, where it is
// written as text, the value is refused by file and line.)
func TestRateLimitConfigsAtTheirExtremes(t *testing.T) {
	for _, c := range []struct {
		unit rlconfv3.RateLimitUnit
		rpu  uint32
	}{{rlconfv3.RateLimitUnit_SECOND, 0}, {rlconfv3.RateLimitUnit_SECOND, math.MaxUint32}, {rlconfv3.RateLimitUnit_YEAR, math.MaxUint32}} {
		cfg, err := FromRateLimitConfigs([]*rlconfv3.RateLimitConfig{{Name: "gw", Domain: "d", Descriptors: []*rlconfv3.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlconfv3.RateLimitPolicy{Unit: c.unit, RequestsPerUnit: c.rpu}}}}})
		if err != nil {
			t.Fatalf("%d per %v: %v", c.rpu, c.unit, err)
		}
		m, ok := cfg.Match("d", &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}})
		if !ok || len(m.Rule.Limits) != 1 {
			t.Fatalf("%d per %v: no limit matched", c.rpu, c.unit)
		}
		l := m.Rule.Limits[0]
		if err := l.Validate(); err != nil {
			t.Fatalf("%d per %v: %v", c.rpu, c.unit, err)
		}
		// A full bucket admits exactly rpu hits at once, and not one more.
		now := int64(1_700_000_000_000)
		states, results := []bucket.State{bucket.Full(l, now)}, make([]bucket.Result, 1)
		if c.rpu > 0 && !bucket.Decide([]bucket.Limit{l}, states, uint64(c.rpu), now, results) {
			t.Errorf("%d per %v: %d hits denied on a full bucket", c.rpu, c.unit, c.rpu)
		}
		if bucket.Decide([]bucket.Limit{l}, states, 1, now, results) {
			t.Errorf("%d per %v: a hit past %d allowed", c.rpu, c.unit, c.rpu)
		}
	}
}
