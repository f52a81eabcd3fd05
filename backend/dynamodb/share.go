package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluice-rl/sluice/regions"
)

// A region's share record of a global key (regions.Record: the loans it
// made and took) is an item of its own beside the entity's config and
// bucket, under the entity's partition: SK #SHARE#{resource}. Only the
// sync writes it, so an operator's config is never touched by it, nor it
// by an operator's tools. Each write bumps a version, and is made on the
// condition that the version is still the one the sync planned from: two
// syncs of one region never write over each other's loans.
const (
	shareSKMarker = "#SHARE#"
	attrShare     = "sh"
	attrShareVer  = "ver"
)

// ShareSK is the sort key of an entity's share record for a resource.
func (k Keys) ShareSK(resource string) string { return shareSKMarker + Encode(resource) }

func (a *Admin) shareKey(entity, resource string) (map[string]types.AttributeValue, error) {
	if entity == "" || resource == "" {
		return nil, fmt.Errorf("a share record needs an entity and a resource, got %q and %q", entity, resource)
	}
	return map[string]types.AttributeValue{attrPK: str(a.keys.EntityPK(entity)), attrSK: str(a.keys.ShareSK(resource))}, nil
}

// GetShare reads the share record of entity's bucket for resource, with
// strong consistency, and the version it is at: 0, with the zero Record,
// when none is stored. One that does not decode is an error, never
// "none": a region taken as holding no loans enforces its whole base.
// With PutShare, an Admin is a sync's Store (regions/syncer).
func (a *Admin) GetShare(ctx context.Context, entity, resource string) (regions.Record, int64, error) {
	key, err := a.shareKey(entity, resource)
	if err != nil {
		return regions.Record{}, 0, err
	}
	out, err := a.api.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(a.table), Key: key, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return regions.Record{}, 0, fmt.Errorf("reading the share of %q/%q: %w", entity, resource, err)
	}
	return decodeShare(out.Item, entity, resource)
}

// GetShares reads the share records of keys, lined up with keys, a
// hundred to a BatchGetItem: a sync reads every key a window's round
// plans at once, not one call per key. consistent asks for strongly
// consistent reads, which a region's own records need (the sync writes
// them on their version); the other regions' records may be read
// eventually consistent, at half the cost: one a moment stale holds fewer
// loans, never more, and only delays what the sync makes of them. Keys
// DynamoDB leaves unprocessed are asked again (batchGet); an error is for
// the whole call, a record that does not decode for its key alone.
func (a *Admin) GetShares(ctx context.Context, keys []regions.Key, consistent bool) ([]regions.Stored, error) {
	out := make([]regions.Stored, len(keys))
	at := make(map[[2]string][]int, len(keys)) // an item: the indexes of keys it answers
	var pending []map[string]types.AttributeValue
	for i, k := range keys {
		key, err := a.shareKey(k.Entity, k.Resource)
		if err != nil {
			out[i].Err = err
			continue
		}
		id := [2]string{attrS(key, attrPK), attrS(key, attrSK)}
		if _, dup := at[id]; !dup {
			pending = append(pending, key)
		}
		at[id] = append(at[id], i)
	}
	for len(pending) > 0 {
		n := min(len(pending), 100)
		found, err := batchGet(ctx, a.api, a.table, pending[:n], consistent, maxBatchAttempts, nil)
		if err != nil {
			return nil, fmt.Errorf("reading %d share records: %w", len(pending), err)
		}
		for _, key := range pending[:n] {
			id := [2]string{attrS(key, attrPK), attrS(key, attrSK)}
			for _, i := range at[id] {
				out[i].Record, out[i].Version, out[i].Err = decodeShare(found[id], keys[i].Entity, keys[i].Resource)
			}
		}
		pending = pending[n:]
	}
	return out, nil
}

// decodeShare reads a share item (none: the zero Record at version 0).
func decodeShare(av map[string]types.AttributeValue, entity, resource string) (regions.Record, int64, error) {
	if len(av) == 0 {
		return regions.Record{}, 0, nil
	}
	sh, ok := av[attrShare].(*types.AttributeValueMemberS)
	v, vok := av[attrShareVer].(*types.AttributeValueMemberN)
	if !ok || !vok {
		return regions.Record{}, 0, fmt.Errorf("the share of %q/%q: an item without its record or version", entity, resource)
	}
	ver, err := strconv.ParseInt(v.Value, 10, 64)
	if err != nil || ver < 1 {
		return regions.Record{}, 0, fmt.Errorf("the share of %q/%q: version %q", entity, resource, v.Value)
	}
	rec, err := regions.Decode([]byte(sh.Value))
	if err != nil {
		return regions.Record{}, 0, fmt.Errorf("the share of %q/%q: %w", entity, resource, err)
	}
	return rec, ver, nil
}

// PutShare writes rec as the share record of entity's bucket for
// resource, on the condition that the stored one is still at version (0:
// that none is stored), and returns the new version. expireAt (epoch
// milliseconds, 0 for never) becomes the item's ttl, so that DynamoDB
// deletes it once its loans are over; an item past it that DynamoDB has
// not deleted yet holds only ended loans, which enforce the base, as no
// item does. A lost condition is regions.ErrShareChanged.
func (a *Admin) PutShare(ctx context.Context, entity, resource string, rec regions.Record, version, expireAt int64) (int64, error) {
	av, err := a.shareKey(entity, resource)
	if err != nil {
		return 0, err
	}
	b, err := regions.Encode(rec)
	if err != nil {
		return 0, fmt.Errorf("the share of %q/%q: %w", entity, resource, err)
	}
	av[attrShare], av[attrShareVer] = str(string(b)), num(version+1)
	if expireAt > 0 {
		av[attrTTL] = num(ceilSeconds(expireAt))
	}
	in := &dynamodb.PutItemInput{TableName: aws.String(a.table), Item: av,
		ExpressionAttributeNames: map[string]string{"#v": attrShareVer}}
	if version == 0 {
		in.ConditionExpression = aws.String("attribute_not_exists(#v)")
	} else {
		in.ConditionExpression = aws.String("#v = :v")
		in.ExpressionAttributeValues = map[string]types.AttributeValue{":v": num(version)}
	}
	if _, err := a.api.PutItem(ctx, in); err != nil {
		var failed *types.ConditionalCheckFailedException
		if errors.As(err, &failed) {
			return 0, fmt.Errorf("the share of %q/%q at version %d: %w", entity, resource, version, regions.ErrShareChanged)
		}
		return 0, fmt.Errorf("writing the share of %q/%q: %w", entity, resource, err)
	}
	return version + 1, nil
}

// readShare reads the share record of entity's bucket for resource for a
// decision (sharecache), with strong consistency: a replica's copy must
// be the table as of its read. None stored is the zero Record.
func (b *Backend) readShare(ctx context.Context, entity, resource string) (regions.Record, error) {
	out, err := b.api.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(b.table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{attrPK: str(b.keys.EntityPK(entity)), attrSK: str(b.keys.ShareSK(resource))}})
	b.stats.call("GetItem", err)
	if err != nil {
		return regions.Record{}, fmt.Errorf("reading the share of %q/%q: %w", entity, resource, err)
	}
	rec, _, err := decodeShare(out.Item, entity, resource)
	return rec, err
}
