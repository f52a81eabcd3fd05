package dynamodb

import (
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// The round trip follows successful writes and lost races, an eighth of
// the way per write, and ignores writes that failed otherwise (a
// timeout says nothing of the distance).
func TestRoundTrip(t *testing.T) {
	var r roundTrip
	if r.ms() != 0 {
		t.Fatal("a new roundTrip is not 0")
	}
	r.observe(70*time.Millisecond, nil)
	if r.ms() != 70 {
		t.Fatalf("first write of 70 ms: %d", r.ms())
	}
	r.observe(5*time.Second, errors.New("context deadline exceeded"))
	if r.ms() != 70 {
		t.Fatalf("a failed write moved it to %d", r.ms())
	}
	r.observe(150*time.Millisecond, &types.ConditionalCheckFailedException{})
	if r.ms() != 80 {
		t.Fatalf("a lost race of 150 ms after 70: %d, want 80", r.ms())
	}
	for range 100 {
		r.observe(5*time.Millisecond, nil)
	}
	if r.ms() != 5 {
		t.Fatalf("after 100 writes of 5 ms: %d", r.ms())
	}
	var near roundTrip
	near.observe(100*time.Microsecond, nil)
	if near.ms() != 1 {
		t.Fatalf("a write of 100 us: %d ms, want 1 (known, and not 0)", near.ms())
	}
}
