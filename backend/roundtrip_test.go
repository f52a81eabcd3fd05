package backend

import (
	"testing"
	"time"
)

// The round trip follows the writes an eighth of the way per write, in
// whole milliseconds, and is known (not 0) from the first write however
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
	for range 100 {
		r.Observe(5 * time.Millisecond)
	}
	if r.Ms() != 5 {
		t.Fatalf("after 100 writes of 5 ms: %d", r.Ms())
	}
	var near RoundTrip
	near.Observe(100 * time.Microsecond)
	if near.Ms() != 1 {
		t.Fatalf("a write of 100 us: %d ms, want 1 (known, and not 0)", near.Ms())
	}
}
