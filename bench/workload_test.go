package bench

import (
	"math"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rl/sluice/descriptors"
)

// draws counts how often each request of rs comes out of n picks with
// one seed, by index in rs.reqs; the over request is index -1.
func draws(t *testing.T, w Workload, seed uint64, n int) (*requestSet, map[int]int) {
	t.Helper()
	rs, err := w.build()
	if err != nil {
		t.Fatal(err)
	}
	index := make(map[*rlsv3.RateLimitRequest]int, len(rs.reqs)+1)
	for i, r := range rs.reqs {
		index[r] = i
	}
	if rs.over != nil {
		index[rs.over] = -1
	}
	counts := map[int]int{}
	p := rs.picker(seed)
	for range n {
		counts[index[p.next()]]++
	}
	return rs, counts
}

func TestWorkloadValues(t *testing.T) {
	rs, err := Workload{Domain: "d", Entries: []Entry{{"a", "x"}, {"b", "v"}}, Dist: Hot, Keys: 5,
		Over: []Entry{{"o", "y"}}, OverFraction: 0.1}.build()
	if err != nil {
		t.Fatal(err)
	}
	if got := rs.reqs[3].Descriptors[0].Entries[1].Value; got != "v-3" {
		t.Errorf("key 3 value %q, want v-3", got)
	}
	if got := rs.reqs[3].Descriptors[0].Entries[0].Value; got != "x" {
		t.Errorf("first entry value %q, want x unchanged", got)
	}
	if e := rs.over.GetDescriptors()[0].GetEntries(); len(e) != 1 || e[0].Key != "o" || e[0].Value != "y" || rs.over.Domain != "d" {
		t.Errorf("over request %v, want domain d, descriptor o=y without suffix", rs.over)
	}

	fixed, err := Workload{Domain: "d", Entries: []Entry{{"a", "x"}}, Dist: Fixed, Keys: 5}.build()
	if err != nil {
		t.Fatal(err)
	}
	if len(fixed.reqs) != 1 || fixed.reqs[0].Descriptors[0].Entries[0].Value != "x" || fixed.over != nil {
		t.Fatalf("fixed workload built %d requests, over %v", len(fixed.reqs), fixed.over)
	}
}

func TestWorkloadHot(t *testing.T) {
	_, counts := draws(t, Workload{Domain: "d", Entries: []Entry{{"a", "x"}}, Dist: Hot, Keys: 5, HotFraction: 0.8}, 3, 10_000)
	if hot := counts[0]; hot < 7_500 || hot > 8_500 {
		t.Fatalf("hot key drawn %d times in 10000, want about 8000", hot)
	}
}

// TestWorkloadZipf checks the shape of the Zipf draw: rank 1 the most
// frequent, the first ranks in decreasing order, each near its share
// k^-s / H(n, s), and every draw within the keys.
func TestWorkloadZipf(t *testing.T) {
	const n, keys, s = 100_000, 50, 1.1
	_, counts := draws(t, Workload{Domain: "d", Entries: []Entry{{"a", "x"}}, Dist: Zipf, Keys: keys, ZipfS: s}, 7, n)
	var h float64
	for k := 1; k <= keys; k++ {
		h += math.Pow(float64(k), -s)
	}
	for i := range 5 {
		want := math.Pow(float64(i+1), -s) / h * n
		if got := float64(counts[i]); math.Abs(got-want) > 0.05*want {
			t.Errorf("rank %d drawn %v times in %d, want %.0f within 5%%", i+1, got, n, want)
		}
		if i > 0 && counts[i] >= counts[i-1] {
			t.Errorf("rank %d drawn %d times, rank %d %d: want fewer", i+1, counts[i], i, counts[i-1])
		}
	}
	total := 0
	for i, c := range counts {
		if i < 0 || i >= keys {
			t.Fatalf("drew index %d of %d keys", i, keys)
		}
		total += c
	}
	if total != n {
		t.Fatalf("%d draws counted of %d", total, n)
	}
}

// TestWorkloadOver checks the over-limit share, that the other calls
// keep their distribution, and that a worker's sequence follows from its
// seed.
func TestWorkloadOver(t *testing.T) {
	const n = 100_000
	w := Workload{Domain: "d", Entries: []Entry{{"a", "x"}}, Dist: Uniform, Keys: 4, Over: []Entry{{"o", "y"}}, OverFraction: 0.25}
	_, counts := draws(t, w, 11, n)
	if over := counts[-1]; math.Abs(float64(over)-0.25*n) > 0.01*n {
		t.Errorf("over-limit calls %d of %d, want 25%% within 1 point", over, n)
	}
	for i := range 4 {
		if c := counts[i]; math.Abs(float64(c)-0.75*n/4) > 0.01*n {
			t.Errorf("key %d drawn %d times of %d, want %.0f within 1 point", i, c, n, 0.75*n/4)
		}
	}
	_, again := draws(t, w, 11, n)
	for i, c := range counts {
		if again[i] != c {
			t.Fatalf("same seed, different draws: %v then %v", counts, again)
		}
	}

	w.OverFraction = 1
	if _, all := draws(t, w, 12, 1000); all[-1] != 1000 {
		t.Errorf("over-limit fraction 1: %d of 1000 calls over", all[-1])
	}
}

// TestWorkloadPickAllocs checks that the hot loop's draw allocates
// nothing, for every distribution.
func TestWorkloadPickAllocs(t *testing.T) {
	for d := Fixed; d <= Zipf; d++ {
		rs, err := Workload{Domain: "d", Entries: []Entry{{"a", "x"}}, Dist: d, Keys: 100, Over: []Entry{{"o", "y"}}, OverFraction: 0.5}.build()
		if err != nil {
			t.Fatal(err)
		}
		p := rs.picker(1)
		if a := testing.AllocsPerRun(1000, func() { p.next() }); a != 0 {
			t.Errorf("%v: %v allocations per draw", d, a)
		}
	}
}

func TestWorkloadRejects(t *testing.T) {
	ok := Workload{Domain: "d", Entries: []Entry{{"a", "x"}}}
	for name, w := range map[string]Workload{
		"zipf s 1":        {Domain: "d", Entries: ok.Entries, Dist: Zipf, Keys: 10, ZipfS: 1},
		"zipf s negative": {Domain: "d", Entries: ok.Entries, Dist: Zipf, Keys: 10, ZipfS: -2},
		"zipf s NaN":      {Domain: "d", Entries: ok.Entries, Dist: Zipf, Keys: 10, ZipfS: math.NaN()},
		"over no entries": {Domain: "d", Entries: ok.Entries, OverFraction: 0.5},
		"over above 1":    {Domain: "d", Entries: ok.Entries, Over: ok.Entries, OverFraction: 1.5},
		"unknown dist":    {Domain: "d", Entries: ok.Entries, Dist: Zipf + 1},
	} {
		if _, err := w.build(); err == nil {
			t.Errorf("%s: built %+v", name, w)
		}
	}
}

func TestParse(t *testing.T) {
	for s, want := range map[string]Distribution{"fixed": Fixed, "Uniform": Uniform, "HOT": Hot, "zipf": Zipf} {
		if d, err := ParseDistribution(s); err != nil || d != want {
			t.Errorf("ParseDistribution(%q) = %v, %v; want %v", s, d, err, want)
		}
	}
	if _, err := ParseDistribution("pareto"); err == nil {
		t.Error("pareto accepted")
	}
	if e, err := ParseEntry("k=a=b"); err != nil || e != (Entry{"k", "a=b"}) {
		t.Errorf("ParseEntry(k=a=b) = %v, %v", e, err)
	}
	for _, s := range []string{"novalue", "=v"} {
		if _, err := ParseEntry(s); err == nil {
			t.Errorf("ParseEntry(%q) accepted", s)
		}
	}
}

// TestRulesYAML checks that the embedded rules (bench/rules/bench.yaml,
// which fleet.sh serves) give each benchmark key the limit the
// benchmarks and the README count on.
func TestRulesYAML(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"bench.yaml": []byte(RulesYAML)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key            string
		amount, period int64 // millitokens per milliseconds
	}{
		{Key, 1_000_000_000 * 1000, 1000},
		{OverKey, 1 * 1000, 3600 * 1000},
		{HotKey, 2000 * 1000, 1000},
	} {
		m, ok := cfg.Match(Domain, request(Domain, []Entry{{tc.key, "v"}}, "").Descriptors[0])
		if !ok {
			t.Errorf("%s: no rule matches", tc.key)
			continue
		}
		if l := m.Rule.Limits; len(l) != 1 || l[0].Amount != tc.amount || l[0].Period != tc.period {
			t.Errorf("%s: limits %v, want one of %d millitokens per %d ms", tc.key, l, tc.amount, tc.period)
		}
	}
}
