package descriptors

import (
	"testing"
)

// idOf is the BucketId an Envoy would send for the pairs kv.
func idOf(kv ...string) map[string]string {
	id := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		id[kv[i]] = kv[i+1]
	}
	return id
}

// TestBucketIDMatchesAsItsDescriptor: a BucketId charges the bucket the
// descriptor of the same pairs, in the tree's order, charges; the map's
// order never matters; ids that no path uses exactly match nothing.
func TestBucketIDMatchesAsItsDescriptor(t *testing.T) {
	c := mustLoad(t, map[string]string{"api.yaml": `
domain: quota
descriptors:
  - key: api
    value: search
    rate_limit: {unit: second, requests_per_unit: 100}
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 10}
      - key: zone
        value: "eu-*"
        rate_limit: {unit: minute, requests_per_unit: 7}
  - key: tenant
    descriptors:
      - key: plan
        value: gold
        rate_limit: {unit: second, requests_per_unit: 50}
  - key: b
    descriptors:
      - key: a
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 2}
`})
	tests := []struct {
		name string
		id   map[string]string
		desc []string // the descriptor it must match as; nil: no match
	}{
		{"one key", idOf("api", "search"), []string{"api", "search"}},
		{"nested, tree order", idOf("tenant", "acme", "api", "search"), []string{"api", "search", "tenant", "acme"}},
		{"wildcard child", idOf("zone", "eu-west", "api", "search"), []string{"api", "search", "zone", "eu-west"}},
		{"wildcard child, no match", idOf("zone", "us-east", "api", "search"), nil},
		{"a key the top level lacks", idOf("tenant", "acme", "plan", "gold"), []string{"tenant", "acme", "plan", "gold"}},
		// Both keys name top-level nodes: "a" is tried first and leads
		// nowhere (its child is keyed "c"), so the walk backtracks to "b",
		// whose child is keyed "a".
		{"two top-level keys: backtrack", idOf("a", "1", "b", "2"), []string{"b", "2", "a", "1"}},
		{"key the tree never names", idOf("api", "search", "colour", "red"), nil},
		{"unknown value", idOf("api", "maps"), nil},
		{"empty id", map[string]string{}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, entries, ok := c.MatchBucketID("quota", tc.id)
			if tc.desc == nil {
				if ok {
					t.Fatalf("matched %s, want no match", m.Rule.Path)
				}
				return
			}
			want, wok := c.Match("quota", desc(tc.desc...))
			if !ok || !wok {
				t.Fatalf("MatchBucketID ok=%v, descriptor match ok=%v", ok, wok)
			}
			if m.Rule != want.Rule || m.Entity != want.Entity || m.Resource != want.Resource || m.Parent != want.Parent {
				t.Errorf("id gives %s entity %q, descriptor gives %s entity %q", m.Rule.Path, m.Entity, want.Rule.Path, want.Entity)
			}
			if len(entries) != len(tc.desc)/2 {
				t.Fatalf("%d entries, want %d", len(entries), len(tc.desc)/2)
			}
			for i, e := range entries {
				if e.Key != tc.desc[2*i] || e.Value != tc.desc[2*i+1] {
					t.Errorf("entry %d = %s=%s, want %s=%s", i, e.Key, e.Value, tc.desc[2*i], tc.desc[2*i+1])
				}
			}
		})
	}
	if _, _, ok := c.MatchBucketID("nope", idOf("api", "search")); ok {
		t.Error("an unknown domain matched")
	}
}

// TestBucketIDOverTheCorpus: every descriptor of the envoyproxy test
// config whose keys are distinct matches, as a BucketId, the rule and
// bucket it matches as a descriptor.
func TestBucketIDOverTheCorpus(t *testing.T) {
	c := loadEnvoyproxy(t)
	descs := [][]string{
		{"key1", "value1", "subkey1", "anything"},
		{"key1", "value1", "subkey1", "gold"},
		{"key1", "value1"},
		{"phone", "2065550100"},
		{"client_ip", "192.0.2.1"},
		{"client_ip", "198.51.100.7"},
		{"service", "healthcheck"},
		{"service", "internal"},
	}
	for _, d := range descs {
		want, wok := c.Match("test-domain", desc(d...))
		m, _, ok := c.MatchBucketID("test-domain", idOf(d...))
		if ok != wok || (ok && (m.Rule != want.Rule || m.Entity != want.Entity || m.Resource != want.Resource)) {
			t.Errorf("%v: id match %v %+v, descriptor match %v %+v", d, ok, m, wok, want)
		}
	}
}
