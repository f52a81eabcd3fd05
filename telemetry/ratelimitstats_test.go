package telemetry

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

func TestCleanStatName(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"edge.remote_address", "edge.remote_address"},
		{"d.masked_remote_address_0.0.0.0/0", "d.masked_remote_address_0_0_0_0/0"},
		{"d.remote_address_10.1.2.3.path_/x", "d.remote_address_10_1_2_3.path_/x"},
		{"d.key_a:b|c", "d.key_a_b_c"},
		{"d.version_1.2.3", "d.version_1.2.3"},         // three groups: no address
		{"d.v_1234.5.6.7", "d.v_1234_5_6_7"},           // the quad starts inside the digits
		{"d.v_1.2.3.4567", "d.v_1_2_3_4567"},           // and ends inside them
		{"d.a_1.2.3.4.5.6.7.8", "d.a_1_2_3_4.5_6_7_8"}, // two quads, the dot between kept
		{"", ""},
	} {
		if got := cleanStatName(c.in); got != c.want {
			t.Errorf("cleanStatName(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// cleanStatName does what envoyproxy/ratelimit's regular expression does,
// on strings made of what matters to it.
func TestCleanStatNameMatchesTheRegexp(t *testing.T) {
	quad := regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)
	model := func(s string) string {
		s = strings.NewReplacer(":", "_", "|", "_").Replace(s)
		return quad.ReplaceAllStringFunc(s, func(m string) string { return strings.ReplaceAll(m, ".", "_") })
	}
	r := rand.New(rand.NewPCG(1, 2))
	const alphabet = "0123456789....:|a_"
	for range 20000 {
		b := make([]byte, r.IntN(24))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		if got, want := cleanStatName(string(b)), model(string(b)); got != want {
			t.Fatalf("cleanStatName(%q) = %q, the regexp gives %q", b, got, want)
		}
	}
}

// A key with nothing to clean, the common case, costs no allocation.
func TestCleanStatNameKeepsCleanKeys(t *testing.T) {
	key := "default/eg/http.httproute/default/backend/rule/0/match/-1_httproute/default/backend/rule/0/match/-1"
	if n := testing.AllocsPerRun(100, func() { cleanStatName(key) }); n != 0 {
		t.Errorf("%v allocations for a clean key", n)
	}
}

func TestStatsLabels(t *testing.T) {
	for _, c := range []struct {
		key                string
		domain, key1, key2 string
		ok                 bool
	}{
		{"edge.remote_address", "edge", "remote_address", "", true},
		{"default/eg/http.route_route.masked_remote_address_0_0_0_0/0", "default/eg/http", "route_route", "masked_remote_address_0_0_0_0/0", true},
		{"d.a.b.c", "", "", "", false}, // Envoy Gateway's mapping drops it
		{"d", "", "", "", false},
		{"d.", "d", "", "", true},
	} {
		domain, key1, key2, ok := statsLabels(c.key)
		if domain != c.domain || key1 != c.key1 || key2 != c.key2 || ok != c.ok {
			t.Errorf("statsLabels(%q) = %q %q %q %v, want %q %q %q %v", c.key, domain, key1, key2, ok, c.domain, c.key1, c.key2, c.ok)
		}
	}
}
