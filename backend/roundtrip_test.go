package backend

import (
	"testing"
	"time"
)

// The round trip follows the writes an eighth of the way per write, in
// whole milliseconds, restarts from a write under a quarter of it (the
// store near again), and is known (not 0) from the first write however
// near the store.
func TestRoundTrip(t *testing.T) {
	const ms = time.Millisecond
	for _, c := range []struct {
		name   string
		writes []time.Duration
		want   int64
	}{
		{"nothing seen", nil, 0},
		{"first write starts it", []time.Duration{70 * ms}, 70},
		{"a slower write moves it an eighth", []time.Duration{70 * ms, 150 * ms}, 80},
		{"a quarter exactly is not under it", []time.Duration{70 * ms, 150 * ms, 20 * ms}, 73},
		{"the first fast write after a slow spell is believed",
			append(repeat(2*time.Second, 10), 10*ms), 10},
		{"one stalled write moves it an eighth", []time.Duration{5 * ms, 200 * ms}, 29},
		{"and is forgotten at the next", []time.Duration{5 * ms, 200 * ms, 5 * ms}, 5},
		{"a write of 100 us is known, not 0", []time.Duration{100 * time.Microsecond}, 1},
	} {
		var r RoundTrip
		for _, d := range c.writes {
			r.Observe(d)
		}
		if got := r.Ms(); got != c.want {
			t.Errorf("%s: %v gives %d ms, want %d", c.name, c.writes, got, c.want)
		}
	}
}

func repeat(d time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}
