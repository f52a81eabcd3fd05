package dynamodb

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluice-rl/sluice/backend"
)

// AllBuckets calls fn for every bucket item of the deployment, read with
// strong consistency by a full scan of the table (an audit, not a path
// for traffic). Items past their ttl that DynamoDB has not yet deleted are
// included, with Expired set: they must keep the invariants too.
func (a *Admin) AllBuckets(ctx context.Context, fn func(backend.Bucket) error) error {
	now := a.now()
	err := a.scanSK(ctx, bucketSKMarker, func(av map[string]types.AttributeValue) error {
		it, err := decodeBucket(av)
		if err != nil {
			return fmt.Errorf("bucket %s %s: %w", attrS(av, attrPK), attrS(av, attrSK), err)
		}
		return fn(backend.Bucket{
			Entity: attrS(av, attrEntity), Resource: attrS(av, attrResource),
			Cfg: it.cfg, TTL: it.ttl, Limits: it.limits, States: it.states, Expired: it.Expired(now),
		})
	})
	if err != nil {
		return fmt.Errorf("scanning for buckets: %w", err)
	}
	return nil
}
