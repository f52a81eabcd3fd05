package descriptors

import (
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/backend/bucket"
)

const identityYAML = `
domain: api
descriptors:
  - key: org
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: team
        value: core
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: api_key
    descriptors:
      - key: model
        value: "gpt-*"
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 10}
      - key: model
        value: "claude-*"
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: tenant
    descriptors:
      - key: user
        descriptors:
          - key: model
            entity: "{user}"
            resource: "chat:{model}"
            parent: "tenant:{tenant}"
            limits:
              - {name: rpm, rate: 100/min, cost: request}
              - {name: tpm, rate: 5/10s, burst: 20}
      - key: app
        entity: shared
        resource: "{tenant}/{app}-x"
        rate_limit: {unit: hour, requests_per_unit: 3}
  - key: everyone
    value: "yes"
    rate_limit: {unit: day, requests_per_unit: 1}
`

func TestIdentity(t *testing.T) {
	c := mustLoad(t, map[string]string{"api.yaml": identityYAML})
	tests := []struct {
		name                     string
		desc                     *rlv3.RateLimitDescriptor
		entity, resource, parent string
	}{
		{"bare levels join", desc("org", "acme", "user", "u1"), "acme/u1", "api/org/user", ""},
		{"exact level contributes nothing", desc("org", "acme", "team", "core"), "acme", "api/org/team=core", ""},
		{"escaping: a/b, c", desc("org", "a/b", "user", "c"), "a%2Fb/c", "api/org/user", ""},
		{"escaping: a, b/c", desc("org", "a", "user", "b/c"), "a/b%2Fc", "api/org/user", ""},
		{"escaping: percent", desc("org", "50%", "user", "%2F"), "50%25/%252F", "api/org/user", ""},
		{"escaping: one level (a node without limits)", desc("org", "a/b"), "a%2Fb", "api/org", ""},
		{"share_threshold keeps the wildcard value out", desc("api_key", "k1", "model", "gpt-4"), "k1", "api/api_key/model=gpt-*", ""},
		{"share_threshold: same bucket for another value", desc("api_key", "k1", "model", "gpt-5"), "k1", "api/api_key/model=gpt-*", ""},
		{"wildcard value is part of the entity", desc("api_key", "k1", "model", "claude-x"), "k1/claude-x", "api/api_key/model=claude-*", ""},
		{"templates, raw values", desc("tenant", "t/1", "user", "u/2", "model", "m%3"), "u/2", "chat:m%3", "tenant:t/1"},
		{"literal entity, mixed resource", desc("tenant", "t1", "app", "a1"), "shared", "t1/a1-x", ""},
		{"every level exact", desc("everyone", "yes"), "_global_", "api/everyone=yes", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, ok := c.Match("api", tt.desc)
			if !ok {
				t.Fatal("no match")
			}
			if m.Entity != tt.entity || m.Resource != tt.resource || m.Parent != tt.parent {
				t.Errorf("entity %q resource %q parent %q, want %q %q %q", m.Entity, m.Resource, m.Parent, tt.entity, tt.resource, tt.parent)
			}
		})
	}

	// Templates do not change the rule's Path, which /debug/config shows.
	m, _ := c.Match("api", desc("tenant", "t", "user", "u", "model", "m"))
	if m.Rule.Path != "api/tenant/user/model" {
		t.Errorf("Path %q, want api/tenant/user/model", m.Rule.Path)
	}
	want := []bucket.Limit{
		{Name: "rpm", Amount: 100 * bucket.Milli, Period: bucket.Minute, Burst: 100 * bucket.Milli, PerRequest: true},
		{Name: "tpm", Amount: 5 * bucket.Milli, Period: 10 * bucket.Second, Burst: 20 * bucket.Milli},
	}
	if len(m.Rule.Limits) != 2 || m.Rule.Limits[0] != want[0] || m.Rule.Limits[1] != want[1] {
		t.Errorf("limits %v, want %v", m.Rule.Limits, want)
	}
	if m.Rule.ReportedName("rpm") != "rpm" {
		t.Errorf("ReportedName(rpm) = %q", m.Rule.ReportedName("rpm"))
	}
}

// The default entity must be injective: different value lists, different
// buckets.
func TestDefaultEntityInjective(t *testing.T) {
	c := mustLoad(t, map[string]string{"api.yaml": identityYAML})
	values := []string{"", "a", "b", "/", "a/b", "b/c", "%", "%2F", "a%2Fb", "c"}
	seen := map[string][2]string{}
	for _, v1 := range values {
		for _, v2 := range values {
			m, ok := c.Match("api", desc("org", v1, "user", v2))
			if !ok {
				t.Fatalf("no match for %q, %q", v1, v2)
			}
			if prev, dup := seen[m.Entity]; dup {
				t.Errorf("(%q, %q) and (%q, %q) share the entity %q", prev[0], prev[1], v1, v2, m.Entity)
			}
			seen[m.Entity] = [2]string{v1, v2}
		}
	}
}

func TestLimitOverride(t *testing.T) {
	c := mustLoad(t, map[string]string{"api.yaml": identityYAML})
	override := func(unit typev3.RateLimitUnit, rpu uint32, mult uint32, kv ...string) *rlv3.RateLimitDescriptor {
		d := desc(kv...)
		d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
		if mult > 0 {
			d.Limit.UnitMultiplier = wrapperspb.UInt32(mult)
		}
		return d
	}
	tests := []struct {
		name             string
		domain           string
		desc             *rlv3.RateLimitDescriptor
		ok               bool
		amount, period   int64
		entity, resource string
	}{
		// The config would match "everyone=yes" with 1/day: the override wins.
		{"ignores the config", "api", override(typev3.RateLimitUnit_MINUTE, 42, 0, "everyone", "yes"), true, 42, bucket.Minute, "yes", "api/everyone/override"},
		{"no matching rule needed", "api", override(typev3.RateLimitUnit_SECOND, 0, 0, "k1", "a/b", "k2", "c"), true, 0, bucket.Second, "a%2Fb/c", "api/k1/k2/override"},
		// Keys are escaped as values are: ("a/b","c") and ("a","b/c") are
		// two key lists, two buckets.
		{"key with a slash", "api", override(typev3.RateLimitUnit_SECOND, 1, 0, "a/b", "x", "c", "y"), true, 1, bucket.Second, "x/y", "api/a%2Fb/c/override"},
		{"the other key with a slash", "api", override(typev3.RateLimitUnit_SECOND, 1, 0, "a", "x", "b/c", "y"), true, 1, bucket.Second, "x/y", "api/a/b%2Fc/override"},
		{"unit multiplier", "api", override(typev3.RateLimitUnit_SECOND, 5, 30, "k", "v"), true, 5, 30 * bucket.Second, "v", "api/k/override"},
		{"year", "api", override(typev3.RateLimitUnit_YEAR, 1, 0, "k", "v"), true, 1, bucket.Year, "v", "api/k/override"},
		{"unknown unit", "api", override(typev3.RateLimitUnit_UNKNOWN, 5, 0, "k", "v"), false, 0, 0, "", ""},
		{"unit out of range", "api", override(typev3.RateLimitUnit(42), 5, 0, "k", "v"), false, 0, 0, "", ""},
		{"period too long", "api", override(typev3.RateLimitUnit_YEAR, 5, 11, "k", "v"), false, 0, 0, "", ""},
		{"unknown domain", "nope", override(typev3.RateLimitUnit_SECOND, 5, 0, "k", "v"), false, 0, 0, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, ok := c.Match(tt.domain, tt.desc)
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v", ok, tt.ok)
			}
			if !ok {
				return
			}
			want := bucket.Limit{Name: "default", Amount: tt.amount * bucket.Milli, Period: tt.period, Burst: tt.amount * bucket.Milli}
			if len(m.Rule.Limits) != 1 || m.Rule.Limits[0] != want {
				t.Errorf("limits %v, want [%v]", m.Rule.Limits, want)
			}
			if got := m.Rule.ReportedName("default"); got != "" {
				t.Errorf("ReportedName(default) = %q, want \"\"", got)
			}
			if m.Entity != tt.entity || m.Resource != tt.resource || m.Parent != "" {
				t.Errorf("entity %q resource %q parent %q, want %q %q \"\"", m.Entity, m.Resource, m.Parent, tt.entity, tt.resource)
			}
			if m.Rule.ShadowMode || m.Rule.Unlimited {
				t.Error("an override is neither shadow nor unlimited")
			}
			// The path labels metrics and logs: request keys stay out of it.
			if want := tt.domain + "/override"; m.Rule.Path != want {
				t.Errorf("rule path %q, want %q", m.Rule.Path, want)
			}
		})
	}
}
