package dynamodb

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/usage"
	"github.com/sluice-rl/sluice/regions"
)

// What a region's replicas were asked for its global keys in a slot is a
// few items per replica (backend/usage), not an item per key: a replica
// with ten thousand busy keys writes a few hundred kilobytes once a
// window, where an ADD per key would be ten thousand writes. They sit
// under USAGE#{slot}#{shard}, the shard picked by the replica's id, so a
// large fleet's writes at the start of a window spread over usage.Shards
// partitions, and a sync reads a slot with usage.Shards queries. SK
// #USAGE#{replica}#{chunk}; each expires a few windows after its slot.
const (
	usageMarker   = "USAGE#"
	usageSKMarker = "#USAGE#"
	attrUsage     = "u"
	// usageChunk is the most JSON one item holds, below DynamoDB's 400
	// KB item limit with room for its keys.
	usageChunk = 350 << 10
)

// UsagePK is the partition key of shard's usage items of slot.
func (k Keys) UsagePK(slot regions.Slot, shard int) string {
	return k.pk(usageMarker, strconv.FormatInt(int64(slot), 10)+"#"+strconv.Itoa(shard))
}

// writeUsage writes this replica's sums of slot (backend.WriteUsage).
func (b *Backend) writeUsage(ctx context.Context, slot regions.Slot, counts map[regions.Key]int64) error {
	window := b.opts.Global.Clock().Window
	expire := ceilSeconds(b.opts.Global.Clock().Start(slot) + 4*window)
	for i, chunk := range usage.Encode(counts, usageChunk) {
		_, err := b.api.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(b.table), Item: map[string]types.AttributeValue{
			attrPK:    str(b.keys.UsagePK(slot, b.replica.Shard)),
			attrSK:    str(usageSKMarker + b.replica.ID + "#" + strconv.Itoa(i)),
			attrUsage: str(string(chunk)),
			attrTTL:   num(expire),
		}})
		b.stats.call("PutItem", err)
		if err != nil {
			return err
		}
	}
	return nil
}

// Usage is what the region's replicas were asked for each global key in
// slot, in parts of its limit (regions.Asked), summed over the replicas
// whose sums were written: what a sync reads as the region's demand. A
// key no replica was asked for is not in it.
func (a *Admin) Usage(ctx context.Context, slot regions.Slot) (map[regions.Key]int64, error) {
	var mu sync.Mutex
	counts := map[regions.Key]int64{}
	errs := make([]error, usage.Shards)
	var wg sync.WaitGroup
	for shard := range usage.Shards {
		wg.Go(func() {
			errs[shard] = a.query(ctx, &dynamodb.QueryInput{
				KeyConditionExpression:    aws.String("#pk = :pk"),
				ExpressionAttributeNames:  map[string]string{"#pk": attrPK},
				ExpressionAttributeValues: map[string]types.AttributeValue{":pk": str(a.keys.UsagePK(slot, shard))},
				ConsistentRead:            aws.Bool(true),
			}, func(av map[string]types.AttributeValue) error {
				mu.Lock()
				defer mu.Unlock()
				return usage.Decode([]byte(attrS(av, attrUsage)), counts)
			})
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("reading the usage of slot %d: %w", slot, err)
		}
	}
	return counts, nil
}

// Moving is what the replica keeps for global shares that move (its
// copies of the share records, its usage; Flush writes the usage of the
// windows that are over), nil when they do not.
func (b *Backend) Moving() *backend.Moving { return b.moving }
