package descriptors

import (
	"os"
	"slices"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sluice-rl/sluice/backend/bucket"
)

func loadEnvoyproxy(t *testing.T) *Config {
	t.Helper()
	data, err := os.ReadFile("testdata/envoyproxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return mustLoad(t, map[string]string{"envoyproxy.yaml": string(data)})
}

// TestEnvoyproxyConfig checks that a config in envoyproxy/ratelimit's format
// selects, for each descriptor, the rule and limit that service selects.
func TestEnvoyproxyConfig(t *testing.T) {
	c := loadEnvoyproxy(t)
	const d = "test-domain"
	type limit struct {
		rpu    int64 // requests per unit
		period int64 // ms
	}
	noLimit := limit{-1, 0}
	tests := []struct {
		name      string
		domain    string
		desc      *rlv3.RateLimitDescriptor
		wantPath  string // "" for no match
		wantLimit limit  // noLimit: the rule has no limits
		check     func(t *testing.T, r *Rule)
	}{
		{"nested bare child", d, desc("key1", "value1", "subkey1", "anything"), d + "/key1=value1/subkey1", limit{5, bucket.Second}, nil},
		{"nested exact child beats bare", d, desc("key1", "value1", "subkey1", "gold"), d + "/key1=value1/subkey1=gold", limit{50, bucket.Second}, nil},
		{"request shallower: the intermediate node", d, desc("key1", "value1"), d + "/key1=value1", noLimit, nil},
		{"request deeper than config", d, desc("key1", "value1", "subkey1", "x", "extra", "y"), "", noLimit, nil},
		{"unknown value, no bare node", d, desc("key1", "value2", "subkey1", "x"), "", noLimit, nil},
		{"key only", d, desc("phone", "2065550100"), d + "/phone", limit{100, bucket.Day}, nil},
		{"key only, another value", d, desc("phone", "2065550199"), d + "/phone", limit{100, bucket.Day}, nil},
		{"bare default", d, desc("client_ip", "192.0.2.1"), d + "/client_ip", limit{10, bucket.Second}, nil},
		{"blacklisted value: zero rate", d, desc("client_ip", "198.51.100.7"), d + "/client_ip=198.51.100.7", limit{0, bucket.Second}, nil},
		{"unlimited", d, desc("service", "healthcheck"), d + "/service=healthcheck", noLimit, func(t *testing.T, r *Rule) {
			if !r.Unlimited {
				t.Error("Unlimited = false, want true")
			}
		}},
		{"whitelisted: matches, no limits", d, desc("service", "internal"), d + "/service=internal", noLimit, func(t *testing.T, r *Rule) {
			if r.Unlimited || r.ShadowMode {
				t.Errorf("Unlimited=%v ShadowMode=%v, want false", r.Unlimited, r.ShadowMode)
			}
		}},
		// The exact node wins even though the bare "service" node has a
		// matching child: envoyproxy never backtracks.
		{"exact node without children, deeper request", d, desc("service", "internal", "user", "alice"), "", noLimit, nil},
		{"shadow mode", d, desc("service", "web", "user", "alice"), d + "/service/user=alice", limit{10, bucket.Minute}, func(t *testing.T, r *Rule) {
			if !r.ShadowMode {
				t.Error("ShadowMode = false, want true")
			}
		}},
		{"not shadow, upper-case unit", d, desc("service", "web", "user", "bob"), d + "/service/user=bob", limit{20, bucket.Minute}, func(t *testing.T, r *Rule) {
			if r.ShadowMode {
				t.Error("ShadowMode = true, want false")
			}
		}},
		{"no child for value", d, desc("service", "web", "user", "eve"), "", noLimit, nil},
		{"named limit", d, desc("plan", "basic", "user", "carol"), d + "/plan=basic/user=carol", limit{30, bucket.Hour}, func(t *testing.T, r *Rule) {
			if r.Name != "carol_basic" || r.Limits[0].Name != "carol_basic" || r.ReportedName("carol_basic") != "carol_basic" {
				t.Errorf("Name %q, limit name %q, reported %q; want carol_basic for all", r.Name, r.Limits[0].Name, r.ReportedName("carol_basic"))
			}
		}},
		{"replaces", d, desc("plan", "premium", "user", "carol"), d + "/plan=premium/user=carol", limit{300, bucket.Hour}, func(t *testing.T, r *Rule) {
			if !slices.Equal(r.Replaces, []string{"carol_basic"}) {
				t.Errorf("Replaces = %q, want [carol_basic]", r.Replaces)
			}
			if r.Name != "" || r.Limits[0].Name != "default" || r.ReportedName("default") != "" {
				t.Errorf("unnamed rate_limit: Name %q, limit name %q, reported %q; want \"\", default, \"\"", r.Name, r.Limits[0].Name, r.ReportedName("default"))
			}
		}},
		{"detailed metric", d, desc("route", "signup"), d + "/route", limit{60, bucket.Minute}, func(t *testing.T, r *Rule) {
			if !r.DetailedMetric {
				t.Error("DetailedMetric = false, want true")
			}
		}},
		{"exact beside detailed metric", d, desc("route", "login"), d + "/route=login", limit{6, bucket.Minute}, func(t *testing.T, r *Rule) {
			if r.DetailedMetric {
				t.Error("DetailedMetric = true, want false")
			}
		}},
		{"exact beats wildcard", d, desc("path", "/api/v1/status"), d + "/path=/api/v1/status", limit{100, bucket.Year}, nil},
		{"first wildcard in file order", d, desc("path", "/api/v1/users"), d + "/path=/api/v1/*", limit{40, bucket.Week}, nil},
		{"second wildcard", d, desc("path", "/api/v2/users"), d + "/path=/api/*", limit{30, bucket.Month}, nil},
		{"star matches nothing", d, desc("path", "/api/"), d + "/path=/api/*", limit{30, bucket.Month}, nil},
		{"wildcard beats bare", d, desc("path", "/api/v1/"), d + "/path=/api/v1/*", limit{40, bucket.Week}, nil},
		{"bare when no wildcard matches", d, desc("path", "/web/index"), d + "/path", limit{1, bucket.Second}, nil},
		{"value equal to a pattern's text", d, desc("path", "/api/*"), d + "/path=/api/*", limit{30, bucket.Month}, nil},
		{"foo*bar*baz", d, desc("name", "foo-bar-baz"), d + "/name=foo*bar*baz", limit{3, bucket.Hour}, nil},
		{"foo*bar*baz, empty runs", d, desc("name", "foobarbaz"), d + "/name=foo*bar*baz", limit{3, bucket.Hour}, nil},
		{"foo*bar*baz needs the suffix", d, desc("name", "foobarbazz"), d + "/name=foo*", limit{1, bucket.Hour}, nil},
		{"foo*", d, desc("name", "foo"), d + "/name=foo*", limit{1, bucket.Hour}, nil},
		{"foo* without bar", d, desc("name", "foobaz"), d + "/name=foo*", limit{1, bucket.Hour}, nil},
		{"bar*b", d, desc("name", "barb"), d + "/name=bar*b", limit{2, bucket.Hour}, nil},
		{"bar*b with a middle", d, desc("name", "bar-and-b"), d + "/name=bar*b", limit{2, bucket.Hour}, nil},
		{"bar*b does not overlap prefix and suffix", d, desc("name", "bar"), d + "/name=*", limit{4, bucket.Hour}, nil},
		{"star", d, desc("name", "zzz"), d + "/name=*", limit{4, bucket.Hour}, nil},
		{"star matches the empty value", d, desc("name", ""), d + "/name=*", limit{4, bucket.Hour}, nil},
		{"limited middle node", d, desc("region", "eu"), d + "/region=eu", limit{1000, bucket.Minute}, nil},
		{"intermediate node without limits", d, desc("region", "eu", "zone", "z1"), d + "/region=eu/zone", noLimit, nil},
		{"three levels, numeric YAML value", d, desc("region", "eu", "zone", "z1", "host", "7"), d + "/region=eu/zone/host=7", limit{7, bucket.Second}, nil},
		{"three levels, other value", d, desc("region", "eu", "zone", "z1", "host", "8"), "", noLimit, nil},
		{"unknown value", d, desc("region", "us"), "", noLimit, nil},
		{"unknown key", d, desc("nope", "x"), "", noLimit, nil},
		{"key is case-sensitive", d, desc("Phone", "1"), "", noLimit, nil},
		{"no entries", d, desc(), "", noLimit, nil},
		{"nil descriptor", d, nil, "", noLimit, nil},
		{"unknown domain", "other", desc("phone", "1"), "", noLimit, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, ok := c.Match(tt.domain, tt.desc)
			if tt.wantPath == "" {
				if ok {
					t.Fatalf("Match = rule %q, want no match", m.Rule.Path)
				}
				return
			}
			if !ok {
				t.Fatalf("no match, want rule %q", tt.wantPath)
			}
			if m.Rule.Path != tt.wantPath {
				t.Fatalf("rule %q, want %q", m.Rule.Path, tt.wantPath)
			}
			if m.Resource != tt.wantPath {
				t.Errorf("Resource %q, want the rule path %q", m.Resource, tt.wantPath)
			}
			if tt.wantLimit == noLimit {
				if len(m.Rule.Limits) != 0 {
					t.Errorf("limits %v, want none", m.Rule.Limits)
				}
			} else {
				want := []bucket.Limit{{Name: m.Rule.Limits[0].Name, Amount: tt.wantLimit.rpu * bucket.Milli,
					Period: tt.wantLimit.period, Burst: tt.wantLimit.rpu * bucket.Milli}}
				if !slices.Equal(m.Rule.Limits, want) {
					t.Errorf("limits %v, want %v", m.Rule.Limits, want)
				}
			}
			if tt.check != nil {
				tt.check(t, m.Rule)
			}
		})
	}
}

func TestEnvoyproxyConfigRules(t *testing.T) {
	c := loadEnvoyproxy(t)
	if got := c.Domains(); !slices.Equal(got, []string{"test-domain"}) {
		t.Errorf("Domains() = %q", got)
	}
	rules := c.Rules()
	// Every node is a rule, in file order: a parent before its children,
	// lines increasing.
	if len(rules) != 28 {
		t.Errorf("%d rules, want 28", len(rules))
	}
	for i, r := range rules {
		if r.File != "envoyproxy.yaml" || r.Domain != "test-domain" || !strings.HasPrefix(r.Path, "test-domain/") {
			t.Errorf("rule %d: file %q domain %q path %q", i, r.File, r.Domain, r.Path)
		}
		if i > 0 && r.Line <= rules[i-1].Line {
			t.Errorf("rule %d (%s) at line %d, after line %d: not in file order", i, r.Path, r.Line, rules[i-1].Line)
		}
	}
	if rules[0].Path != "test-domain/key1=value1" || rules[0].Line != 7 {
		t.Errorf("first rule %q at line %d, want test-domain/key1=value1 at line 7", rules[0].Path, rules[0].Line)
	}
}

func TestMatchAllocations(t *testing.T) {
	c := loadEnvoyproxy(t)
	cases := []*rlv3.RateLimitDescriptor{
		desc("key1", "value1", "subkey1", "gold"), // exact levels, _global_
		desc("key1", "value1", "subkey1", "x"),    // bare level: the entity is the value itself
		desc("client_ip", "192.0.2.1"),
		desc("nope", "x"),
	}
	for _, d := range cases {
		if n := testing.AllocsPerRun(100, func() { c.Match("test-domain", d) }); n != 0 {
			t.Errorf("Match(%v) allocates %v times, want 0", d.GetEntries(), n)
		}
	}
}

func TestPattern(t *testing.T) {
	tests := []struct {
		pattern, value string
		want           bool
	}{
		{"*", "", true},
		{"*", "abc", true},
		{"foo*", "foo", true},
		{"foo*", "foobar", true},
		{"foo*", "fo", false},
		{"foo*", "xfoo", false},
		{"*foo", "xfoo", true},
		{"*foo", "foox", false},
		{"bar*b", "barb", true},
		{"bar*b", "bar", false},
		{"bar*b", "barxb", true},
		{"a*a", "a", false},
		{"a*a", "aa", true},
		{"foo*bar*baz", "foobarbaz", true},
		{"foo*bar*baz", "foo1bar2baz", true},
		{"foo*bar*baz", "foobaz", false},
		{"foo*bar*baz", "foobarbarbaz", true},
		{"foo*bar*baz", "foobazbar", false},
		{"a**b", "ab", true},
		{"*x*", "axb", true},
		{"*x*", "ab", false},
	}
	for _, tt := range tests {
		if got := compilePattern(tt.pattern).match(tt.value); got != tt.want {
			t.Errorf("%q matches %q = %v, want %v", tt.pattern, tt.value, got, tt.want)
		}
	}
}

func BenchmarkMatch(b *testing.B) {
	data, err := os.ReadFile("testdata/envoyproxy.yaml")
	if err != nil {
		b.Fatal(err)
	}
	c, err := Parse(map[string][]byte{"envoyproxy.yaml": data})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		d    *rlv3.RateLimitDescriptor
	}{
		{"exact", desc("key1", "value1", "subkey1", "gold")},
		{"bare", desc("key1", "value1", "subkey1", "x")},
		{"wildcard", desc("name", "foo-bar-baz")},
		{"miss", desc("nope", "x")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.Match("test-domain", bc.d)
			}
		})
	}
}

// Envoy sends an entry with an empty value for a header that is present
// but empty. envoyproxy/ratelimit finds no rule for "key_" and falls back
// to a wildcard that matches nothing at all ("*"), then to the key's rule
// without a value, and counts the request there like any other value. So
// must Sluice: an empty value gets a bucket of its own (emptyName), never
// the empty entity that names no bucket, and never a bucket of a
// non-empty value. Templates that render nothing, for the entity, the
// resource or the parent, get the same.
func TestEmptyValueMatchesLikeEnvoyproxy(t *testing.T) {
	c := mustLoad(t, map[string]string{"e.yaml": `domain: e
descriptors:
  - key: block
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: star
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: prefix
    value: "a*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: prefix
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: org
    descriptors:
      - key: user
        entity: "{user}"
        resource: "{org}"
        parent: "{org}"
        rate_limit: {unit: second, requests_per_unit: 3}
`})
	for _, tc := range []struct {
		name                           string
		desc                           *rlv3.RateLimitDescriptor
		path, entity, resource, parent string
	}{
		{"bare key", desc("block", ""), "e/block", emptyName, "e/block", ""},
		{"a value like the placeholder is another bucket", desc("block", emptyName), "e/block", "%25empty", "e/block", ""},
		{"wildcard that matches nothing at all", desc("star", ""), "e/star=*", emptyName, "e/star=*", ""},
		{"prefix wildcard does not match it", desc("prefix", ""), "e/prefix", emptyName, "e/prefix", ""},
		{"templates rendering nothing", desc("org", "", "user", ""), "e/org/user", emptyName, emptyName, emptyName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, ok := c.Match("e", tc.desc)
			if !ok {
				t.Fatal("no match")
			}
			if m.Rule.Path != tc.path || m.Entity != tc.entity || m.Resource != tc.resource || m.Parent != tc.parent {
				t.Errorf("got rule %s entity %q resource %q parent %q, want %s %q %q %q",
					m.Rule.Path, m.Entity, m.Resource, m.Parent, tc.path, tc.entity, tc.resource, tc.parent)
			}
		})
	}
}
