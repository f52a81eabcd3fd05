package dynamodb

import (
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluice-rl/sluice/backend"
)

// The round trip counts successful writes and lost races, and ignores
// writes that failed otherwise (a timeout says nothing of the distance).
func TestObserveWrite(t *testing.T) {
	var r backend.RoundTrip
	observeWrite(&r, 70*time.Millisecond, nil)
	if r.Ms() != 70 {
		t.Fatalf("first write of 70 ms: %d", r.Ms())
	}
	observeWrite(&r, 5*time.Second, errors.New("context deadline exceeded"))
	if r.Ms() != 70 {
		t.Fatalf("a failed write moved it to %d", r.Ms())
	}
	observeWrite(&r, 150*time.Millisecond, &types.ConditionalCheckFailedException{})
	if r.Ms() != 80 {
		t.Fatalf("a lost race of 150 ms after 70: %d, want 80", r.Ms())
	}
	observeWrite(&r, 150*time.Millisecond, &types.TransactionCanceledException{})
	if r.Ms() == 80 {
		t.Fatal("a cancelled transaction (a lost race) was left out")
	}
}
