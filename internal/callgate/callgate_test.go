package callgate

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	sluiceddb "github.com/sluice-rl/sluice/backend/dynamodb"
)

// slowQueries is an AdminAPI whose queries take a while and count how
// many are in flight at most; its other calls are not implemented.
type slowQueries struct {
	sluiceddb.AdminAPI
	in, most atomic.Int64
}

func (s *slowQueries) Query(ctx context.Context, _ *dynamodb.QueryInput, _ ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	n := s.in.Add(1)
	defer s.in.Add(-1)
	for m := s.most.Load(); n > m && !s.most.CompareAndSwap(m, n); m = s.most.Load() {
	}
	time.Sleep(5 * time.Millisecond)
	return &dynamodb.QueryOutput{}, nil
}

// TestQueriesWaitTheirTurn: sixteen queries at once, as a usage read
// makes them, reach the table SyncQueries at a time, and all of them
// are answered.
func TestQueriesWaitTheirTurn(t *testing.T) {
	api := &slowQueries{}
	gated := DynamoDB(api, New(SyncQueries))
	var wg sync.WaitGroup
	var answered atomic.Int64
	for range 16 {
		wg.Go(func() {
			if _, err := gated.Query(context.Background(), &dynamodb.QueryInput{}); err != nil {
				t.Error(err)
				return
			}
			answered.Add(1)
		})
	}
	wg.Wait()
	if n := api.most.Load(); n != SyncQueries {
		t.Errorf("%d queries in flight at most, want %d", n, SyncQueries)
	}
	if n := answered.Load(); n != 16 {
		t.Errorf("%d of 16 queries answered", n)
	}
}

// TestGateGivesUpWithItsCaller: a caller that waits for a place gives up
// when its context ends, and takes none.
func TestGateGivesUpWithItsCaller(t *testing.T) {
	g := New(1)
	if err := g.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := g.Enter(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a full gate let its caller in or failed otherwise: %v", err)
	}
	g.Leave()
	if err := g.Enter(context.Background()); err != nil {
		t.Errorf("the place given back was not free: %v", err)
	}
}
