package lease

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sluice-rl/sluice/backend/bucket"
)

func limit(amount, period, burst int64) bucket.Limit {
	return bucket.Limit{Name: "x", Amount: amount * bucket.Milli, Period: period, Burst: burst * bucket.Milli}
}

func TestSize(t *testing.T) {
	p := Policy{Horizon: 10_000} // 10 s, share 0.1
	big := limit(1_000_000, bucket.Second, 1_000_000)
	small := limit(100, bucket.Second, 100)
	perMs := func(tokensPerSecond float64) float64 { return tokensPerSecond * bucket.Milli / 1000 }
	cases := []struct {
		name        string
		p           Policy
		l           bucket.Limit
		own, fleet  float64
		avail, want int64
	}{
		{"off", Policy{}, big, perMs(50), perMs(50), big.Burst, 0},
		{"no demand", p, big, 0, perMs(50), big.Burst, 0},
		{"a horizon of own demand", p, big, perMs(50), perMs(50), big.Burst, 500 * bucket.Milli},
		{"other replicas' demand does not raise it", p, big, perMs(50), perMs(5000), big.Burst, 500 * bucket.Milli},
		{"a fleet estimate below own counts as own", p, big, perMs(50), perMs(1), big.Burst, 500 * bucket.Milli},
		{"the fleet's share of the burst", p, small, perMs(50), perMs(50), small.Burst, 10 * bucket.Milli},
		{"this replica's part of that share", p, small, perMs(50), perMs(200), small.Burst, 2 * bucket.Milli},
		{"half its part of what the bucket holds", p, small, perMs(50), perMs(50), 6 * bucket.Milli, 3 * bucket.Milli},
		{"nothing near the limit", p, small, perMs(50), perMs(50), 1 * bucket.Milli, 0},
		{"whole tokens only", p, big, perMs(0.15), perMs(0.15), big.Burst, 1 * bucket.Milli},
		{"less than a token is nothing", p, big, perMs(0.05), perMs(0.05), big.Burst, 0},
		{"an empty bucket", p, big, perMs(50), perMs(50), 0, 0},
		{"a zero burst", p, limit(0, bucket.Second, 0), perMs(50), perMs(50), 5, 0},
		{"a share above 1 is the default", Policy{Horizon: 10_000, Share: 7}, small, perMs(50), perMs(50), small.Burst, 10 * bucket.Milli},
		{"a share of its own", Policy{Horizon: 10_000, Share: 0.5}, small, perMs(50), perMs(50), small.Burst, 50 * bucket.Milli},
		{"NaN demand", p, big, math.NaN(), perMs(50), big.Burst, 0},
		{"infinite demand is capped at the share", p, small, math.Inf(1), math.Inf(1), small.Burst, 10 * bucket.Milli},
	}
	for _, c := range cases {
		if got := c.p.Size(c.l, c.own, c.fleet, c.avail); got != c.want {
			t.Errorf("%s: Size = %d, want %d", c.name, got, c.want)
		}
	}
}

// Whatever the inputs, a lease is whole tokens, never negative, never
// more than the bucket holds, and the leases of replicas whose demands
// add up to the fleet's stay within the share of the burst together.
func TestSizeProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	p := Policy{Horizon: 1 + rng.Int64N(60_000)}
	for range 20_000 {
		p.Horizon = 1 + rng.Int64N(60_000)
		l := limit(rng.Int64N(1_000_000), 1+rng.Int64N(bucket.Hour), rng.Int64N(1_000_000))
		n := 1 + rng.IntN(12)
		own := make([]float64, n)
		var fleet float64
		for i := range own {
			own[i] = rng.Float64() * math.Pow(10, float64(rng.IntN(8)-3))
			fleet += own[i]
		}
		avail := rng.Int64N(l.Burst + 1)
		var total int64
		for i := range own {
			g := p.Size(l, own[i], fleet, avail)
			if g < 0 || g > avail || g%bucket.Milli != 0 {
				t.Fatalf("Size(%+v, %g, %g, %d) = %d", l, own[i], fleet, avail, g)
			}
			total += g
		}
		if share := DefaultShare * float64(l.Burst); float64(total) > share*(1+1e-9) {
			t.Fatalf("%d replicas lease %d of burst %d together, over the share %g", n, total, l.Burst, share)
		}
		if float64(total) > float64(avail)/2*(1+1e-9) {
			t.Fatalf("%d replicas lease %d together of %d left in the bucket", n, total, avail)
		}
	}
}

func TestRenew(t *testing.T) {
	for _, c := range []struct {
		held, granted int64
		want          bool
	}{{10, 20, true}, {11, 20, false}, {0, 20, true}, {0, 0, false}, {5, 0, false}} {
		if got := Renew(c.held, c.granted); got != c.want {
			t.Errorf("Renew(%d, %d) = %v", c.held, c.granted, got)
		}
	}
}

func TestRateFollowsASteadyPace(t *testing.T) {
	const tau = 1000
	var r Rate
	if r.At(5, tau) != 0 {
		t.Fatal("a new Rate is not 0")
	}
	// 1000 millitokens every 10 ms: 100 per ms.
	now := int64(1_000_000)
	for range 1000 {
		now += 10
		r.Add(1000, now, tau)
	}
	if got := r.At(now, tau); math.Abs(got-100)/100 > 0.01 {
		t.Fatalf("steady 100/ms estimated at %g", got)
	}
	// Silence for one tau leaves 1/e of it; the past never runs back.
	if got := r.At(now+tau, tau); math.Abs(got-100/math.E)/100 > 0.01 {
		t.Fatalf("after one tau of silence: %g", got)
	}
	before := r.At(now, tau)
	r.Add(0, now-500, tau)
	if r.At(now, tau) != before {
		t.Fatal("an Add in the past changed the estimate")
	}
}

func TestCounterReadsARunningTotal(t *testing.T) {
	const tau = 1000
	var c Counter
	now, total := int64(1_000_000), int64(5_000_000) // the base: nothing counted yet
	c.Observe(total, now, tau)
	if c.At(now, tau) != 0 {
		t.Fatal("the first reading counted")
	}
	for range 500 {
		now += 20
		total += 4000 // 200 per ms
		c.Observe(total, now, tau)
	}
	if got := c.At(now, tau); math.Abs(got-200)/200 > 0.05 {
		t.Fatalf("a total growing 200/ms estimated at %g", got)
	}
	// The item was rebuilt: its total starts low again, and only growth
	// from there counts.
	c.Observe(1000, now+1, tau)
	after := c.At(now+1, tau)
	c.Observe(1000, now+2, tau)
	if got := c.At(now+2, tau); got > after {
		t.Fatalf("a total that did not grow raised the estimate: %g > %g", got, after)
	}
}
