// Package callgate bounds how many calls a client has in flight at once.
// A region's sync wraps its DynamoDB clients in one (DynamoDB): its
// reads of a window's usage are a query per usage shard of every region,
// sixteen a region at once (backend/usage.Shards), and a table that
// answers them all in the same instant answers its own replicas'
// decisions behind them. Nothing the sync reads is waited for by a
// decision, so its calls can queue instead.
package callgate

import (
	"context"
	"fmt"
)

// Gate lets at most its capacity of callers in at once; the others wait
// their turn, or until their context ends. Make one with New.
type Gate struct{ slots chan struct{} }

// New is a Gate for n callers at once (at least 1).
func New(n int) *Gate { return &Gate{slots: make(chan struct{}, max(n, 1))} }

// Enter waits for a place, or for ctx to end; a caller that entered
// calls Leave once its call is over.
func (g *Gate) Enter(ctx context.Context) error {
	select {
	case g.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for one of %d calls in flight: %w", cap(g.slots), ctx.Err())
	}
}

// Leave gives back the place Enter took.
func (g *Gate) Leave() { <-g.slots }
