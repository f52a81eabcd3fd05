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
	var r RoundTrip
	if r.Ms() != 0 {
		t.Fatal("a new RoundTrip is not 0")
	}
	r.Observe(70 * time.Millisecond)
	if r.Ms() != 70 {
		t.Fatalf("first write of 70 ms: %d", r.Ms())
	}
	r.Observe(150 * time.Millisecond)
	if r.Ms() != 80 {
		t.Fatalf("150 ms after 70: %d, want 80", r.Ms())
	}
	r.Observe(20 * time.Millisecond) // a quarter: not under it
	if r.Ms() != 73 {
		t.Fatalf("20 ms after an average of 80: %d, want 73 (an eighth of the way)", r.Ms())
	}
	// A table that answered in 2 s, then in 10 ms again: the first fast
	// write is believed, not the thirtieth.
	var back RoundTrip
	for range 10 {
		back.Observe(2 * time.Second)
	}
	back.Observe(10 * time.Millisecond)
	if back.Ms() != 10 {
		t.Fatalf("a write of 10 ms after ten of 2 s: %d, want 10", back.Ms())
	}
	// One stalled write among fast ones is forgotten at the next.
	var stall RoundTrip
	stall.Observe(5 * time.Millisecond)
	stall.Observe(200 * time.Millisecond)
	if stall.Ms() != 29 {
		t.Fatalf("a write of 200 ms after 5: %d, want 29", stall.Ms())
	}
	stall.Observe(5 * time.Millisecond)
	if stall.Ms() != 5 {
		t.Fatalf("5 ms after the stall: %d, want 5", stall.Ms())
	}
	var near RoundTrip
	near.Observe(100 * time.Microsecond)
	if near.Ms() != 1 {
		t.Fatalf("a write of 100 us: %d ms, want 1 (known, and not 0)", near.Ms())
	}
}
