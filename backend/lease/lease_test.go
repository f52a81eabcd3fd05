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
		if got := c.p.Size(c.l, Ask{Own: c.own, Fleet: c.fleet, Avail: c.avail}); got != c.want {
			t.Errorf("%s: Size = %d, want %d", c.name, got, c.want)
		}
	}
}

// A lease spent faster than planned at least doubles at its next grant,
// within the same caps; near the limit, where those caps leave nothing,
// a replica still takes its part of the refill over two round trips, up
// to its own demand over them and never more than half the bucket holds:
// the other half is for the writes of the other replicas on their way.
func TestSizeGrowsAndKeepsTheRefillNearTheLimit(t *testing.T) {
	p := Policy{Horizon: 30_000}
	perMs := func(tokensPerSecond float64) float64 { return tokensPerSecond * bucket.Milli / 1000 }
	big := limit(1_000_000, bucket.Second, 1_000_000)
	far := limit(500, bucket.Second, 500) // 500 a second: 0.5 millitokens per ms
	cases := []struct {
		name string
		l    bucket.Limit
		a    Ask
		want int64
	}{
		{"estimate below the last grant: twice it", big, Ask{Own: perMs(1), Avail: big.Burst, Grow: 40 * bucket.Milli}, 80 * bucket.Milli},
		{"estimate above twice the grant: the estimate", big, Ask{Own: perMs(10), Avail: big.Burst, Grow: 40 * bucket.Milli}, 300 * bucket.Milli},
		{"growth stays within the share", big, Ask{Own: perMs(1), Avail: big.Burst, Grow: 90_000 * bucket.Milli}, 100_000 * bucket.Milli},
		{"growth stays within half of what is left", big, Ask{Own: perMs(1), Avail: 100 * bucket.Milli, Grow: 40 * bucket.Milli}, 50 * bucket.Milli},
		{"growth needs demand", big, Ask{Own: 0, Avail: big.Burst, Grow: 40 * bucket.Milli}, 0},
		{"an empty bucket near the limit: nothing", far, Ask{Own: perMs(5000), Avail: 0, RTT: 70}, 0},
		{"near the limit, alone: half the bucket, the rest for the next round trip", far, Ask{Own: perMs(5000), Avail: 120 * bucket.Milli, RTT: 70}, 60 * bucket.Milli},
		{"near the limit, a third of the fleet: a third of it", far, Ask{Own: perMs(5000), Fleet: perMs(15000), Avail: 120 * bucket.Milli, RTT: 70}, 23 * bucket.Milli},
		{"the refill's part is capped at half of what is there", far, Ask{Own: perMs(5000), Avail: 30 * bucket.Milli, RTT: 70}, 15 * bucket.Milli},
		{"two round trips of demand past the share, from half the bucket", far, Ask{Own: perMs(400), Avail: 500 * bucket.Milli, RTT: 100}, 80 * bucket.Milli},
		{"no more than half the bucket", far, Ask{Own: perMs(4000), Avail: 500 * bucket.Milli, RTT: 100}, 250 * bucket.Milli},
		{"no round trip measured: no refill lease", far, Ask{Own: perMs(5000), Avail: 20 * bucket.Milli}, 10 * bucket.Milli},
		{"topped up to the horizon", big, Ask{Own: perMs(10), Avail: big.Burst, Held: 100 * bucket.Milli}, 200 * bucket.Milli},
		{"topped up to the share", big, Ask{Own: perMs(10000), Avail: big.Burst, Held: 99_000 * bucket.Milli}, 1000 * bucket.Milli},
		{"a lease at its share gets nothing", big, Ask{Own: perMs(1000), Avail: big.Burst, Held: 100_000 * bucket.Milli, Grow: 500 * bucket.Milli}, 0},
		{"topped up near the limit", far, Ask{Own: perMs(5000), Avail: 140 * bucket.Milli, Held: 50 * bucket.Milli, RTT: 70}, 20 * bucket.Milli},
		{"and to own demand over two round trips", far, Ask{Own: perMs(100), Avail: 140 * bucket.Milli, Held: 50 * bucket.Milli, RTT: 70}, 0},
	}
	for _, c := range cases {
		if got := p.Size(c.l, c.a); got != c.want {
			t.Errorf("%s: Size = %d, want %d", c.name, got, c.want)
		}
	}
}

// Whatever the inputs, a lease is whole tokens, never negative, never
// more than the bucket holds, and the leases of replicas whose demands
// add up to the fleet's stay within half what the bucket holds together,
// plus (near the limit) the refill over two round trips, which the
// replicas' parts of it add up to; with no round trip known, within the
// share of the burst too.
func TestSizeProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	p := Policy{}
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
		var rtt int64
		if rng.IntN(2) == 0 {
			rtt = rng.Int64N(500)
		}
		var total int64
		for i := range own {
			var grow int64
			if rng.IntN(3) == 0 {
				grow = rng.Int64N(l.Burst + 1)
			}
			g := p.Size(l, Ask{Own: own[i], Fleet: fleet, Avail: avail, Grow: grow, RTT: rtt})
			if g < 0 || g > avail || g%bucket.Milli != 0 {
				t.Fatalf("Size(%+v, %g, %g, %d) = %d", l, own[i], fleet, avail, g)
			}
			total += g
			// What a lease holds already counts against its caps.
			held := rng.Int64N(l.Burst + 1)
			more := p.Size(l, Ask{Own: own[i], Fleet: fleet, Avail: avail, Grow: grow, RTT: rtt, Held: held})
			part := min(own[i]/fleet, 1)
			rtt2 := 2 * float64(rtt)
			caps := max(DefaultShare*float64(l.Burst)*part,
				min(own[i]*rtt2, max(float64(avail)*part/2, float64(l.Amount)/float64(l.Period)*part*rtt2)))
			if more < 0 || more > avail || (more > 0 && float64(held+more) > caps*(1+1e-9)+bucket.Milli) {
				t.Fatalf("Size(%+v, own %g, fleet %g, avail %d, held %d) = %d, over the caps %g", l, own[i], fleet, avail, held, more, caps)
			}
		}
		refill := float64(l.Amount) / float64(l.Period) * 2 * float64(rtt)
		if share := DefaultShare * float64(l.Burst); rtt == 0 && float64(total) > share*(1+1e-9) {
			t.Fatalf("%d replicas lease %d of burst %d together, over the share %g", n, total, l.Burst, share)
		}
		if float64(total) > (float64(avail)/2+refill)*(1+1e-9) {
			t.Fatalf("%d replicas lease %d together of %d left in the bucket (refill %g)", n, total, avail, refill)
		}
	}
}

func TestRenew(t *testing.T) {
	perMs := func(tokensPerSecond float64) float64 { return tokensPerSecond * bucket.Milli / 1000 }
	for _, c := range []struct {
		held, granted int64
		own           float64
		rtt           int64
		want          bool
	}{
		{10, 20, 0, 0, true},
		{11, 20, 0, 0, false},
		{0, 20, 0, 0, true},
		{0, 0, 0, 0, false},
		{5, 0, perMs(1000), 70, false},
		// 100 tokens at 1,000 a second last 100 ms: under three round
		// trips of 70 ms, over three of 5 ms.
		{100 * bucket.Milli, 150 * bucket.Milli, perMs(1000), 70, true},
		{100 * bucket.Milli, 150 * bucket.Milli, perMs(1000), 5, false},
	} {
		if got := Renew(c.held, c.granted, c.own, c.rtt); got != c.want {
			t.Errorf("Renew(%d, %d, %g, %d) = %v", c.held, c.granted, c.own, c.rtt, got)
		}
	}
}

// Read as demand arrives, a Rate sees a key's new pace from its first
// calls: over the time since the first (at least the window), then, as
// the average fills, the average itself.
func TestRateArriving(t *testing.T) {
	const tau, window = 30_000, 1000
	var r Rate
	if r.Arriving(5, tau, window) != 0 {
		t.Fatal("a new Rate is not 0")
	}
	now := int64(1_000_000)
	r.Add(1000, now, tau) // one token
	// One call reads as one a second (the window), not 1/30 of it.
	if got := r.Arriving(now, tau, window); math.Abs(got-1)/1 > 0.02 {
		t.Fatalf("first call read as %g per ms, want about 1 (a token a second)", got*1000/bucket.Milli)
	}
	// 800 more in 800 ms: read over the window as 801 a second, while
	// At still sees a fraction of it.
	for range 800 {
		now++
		r.Add(1000, now, tau)
	}
	got := r.Arriving(now, tau, window)
	// 801 tokens over the window (1 s, longer than the 800 ms elapsed).
	if want := 801.0 * bucket.Milli / window; math.Abs(got-want)/want > 0.02 {
		t.Fatalf("arriving %g, want %g", got, want)
	}
	if at := r.At(now, tau); at > got/20 {
		t.Fatalf("At %g is not the biased average far below %g", at, got)
	}
	// Steady for many taus: the same as At, but for the bias left of
	// the start (e^-6.7 of it).
	for range 200_000 {
		now += 1
		r.Add(2, now, tau)
	}
	if a, b := r.Arriving(now, tau, window), r.At(now, tau); math.Abs(a-b)/b > 0.005 {
		t.Fatalf("after many taus Arriving %g and At %g differ", a, b)
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

// A replica is short when the lease it could get covers less than a
// round trip of its demand: a bucket asked beyond its means from afar,
// not a key far below its limit whose lease is still growing.
func TestShort(t *testing.T) {
	p := Policy{Horizon: 30_000}
	perMs := func(tokensPerSecond float64) float64 { return tokensPerSecond * bucket.Milli / 1000 }
	l := limit(500, bucket.Second, 500)
	big := limit(1_000_000_000, bucket.Second, 1_000_000_000)
	for _, c := range []struct {
		name string
		l    bucket.Limit
		a    Ask
		want bool
	}{
		{"a full bucket asked 3,000 a second from 200 ms", l, Ask{Own: perMs(3000), Avail: 500 * bucket.Milli, RTT: 200}, true},
		{"a full bucket asked 400 a second from 200 ms", l, Ask{Own: perMs(400), Avail: 500 * bucket.Milli, RTT: 200}, false},
		{"an empty bucket at its limit", l, Ask{Own: perMs(3000), Fleet: perMs(9000), Avail: 0, RTT: 70}, true},
		{"a huge bucket asked a lot", big, Ask{Own: perMs(100_000), Avail: big.Burst, RTT: 70}, false},
		{"no round trip known", l, Ask{Own: perMs(3000), Avail: 0}, false},
		{"no demand", l, Ask{Avail: 0, RTT: 70}, false},
	} {
		if got := p.Short(c.l, c.a); got != c.want {
			t.Errorf("%s: Short = %v, want %v", c.name, got, c.want)
		}
	}
}
