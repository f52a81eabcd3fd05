package callgate

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	sluiceddb "github.com/sluice-rl/sluice/backend/dynamodb"
)

// SyncQueries is how many queries a sync has in flight on one region's
// table: a window's usage read of a region (sixteen queries) then takes
// four round trips, about 300 ms across an ocean, well within the first
// round's time (regions/syncer.Sync.Starts), where sixteen at once, from
// every region's sync in the same instant, held the replicas' writes
// for 100 to 300 ms on a machine shared with the table
// (BENCHMARKS.md section 6).
const SyncQueries = 4

// DynamoDB is api with its queries let through g: the sync's usage reads
// (Admin.Usage). Its other calls, batches of share records and one write
// a key, go as they come: gating them would stretch a round of many keys
// past its budget.
func DynamoDB(api sluiceddb.AdminAPI, g *Gate) sluiceddb.AdminAPI {
	return gatedDynamoDB{AdminAPI: api, gate: g}
}

type gatedDynamoDB struct {
	sluiceddb.AdminAPI
	gate *Gate
}

func (a gatedDynamoDB) Query(ctx context.Context, in *dynamodb.QueryInput, opts ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	if err := a.gate.Enter(ctx); err != nil {
		return nil, err
	}
	defer a.gate.Leave()
	return a.AdminAPI.Query(ctx, in, opts...)
}
