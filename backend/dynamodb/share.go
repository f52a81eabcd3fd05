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

// Share is a share record as the table holds it.
type Share struct {
	Record regions.Record
	// Version counts the writes of the record; 0 when none is stored.
	Version int64
}

// ErrShareChanged is PutShare's answer when the stored record is no
// longer at the version the write was planned from.
var ErrShareChanged = errors.New("the share record changed since it was read")

func (a *Admin) shareKey(entity, resource string) (map[string]types.AttributeValue, error) {
	if entity == "" || resource == "" {
		return nil, fmt.Errorf("a share record needs an entity and a resource, got %q and %q", entity, resource)
	}
	return map[string]types.AttributeValue{attrPK: str(a.keys.EntityPK(entity)), attrSK: str(a.keys.ShareSK(resource))}, nil
}

// GetShare reads the share record of entity's bucket for resource, with
// strong consistency. None stored is (Share{}, false, nil); one that does
// not decode is an error, never "none": a region taken as holding no
// loans enforces its whole base.
func (a *Admin) GetShare(ctx context.Context, entity, resource string) (Share, bool, error) {
	key, err := a.shareKey(entity, resource)
	if err != nil {
		return Share{}, false, err
	}
	out, err := a.api.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(a.table), Key: key, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return Share{}, false, fmt.Errorf("reading the share of %q/%q: %w", entity, resource, err)
	}
	if len(out.Item) == 0 {
		return Share{}, false, nil
	}
	s, err := decodeShare(out.Item)
	if err != nil {
		return Share{}, false, fmt.Errorf("the share of %q/%q: %w", entity, resource, err)
	}
	return s, true, nil
}

// decodeShare reads a share item.
func decodeShare(av map[string]types.AttributeValue) (Share, error) {
	sh, ok := av[attrShare].(*types.AttributeValueMemberS)
	if !ok {
		return Share{}, errors.New("no share in the item")
	}
	v, ok := av[attrShareVer].(*types.AttributeValueMemberN)
	if !ok {
		return Share{}, errors.New("no version in the item")
	}
	ver, err := strconv.ParseInt(v.Value, 10, 64)
	if err != nil || ver < 1 {
		return Share{}, fmt.Errorf("version %q", v.Value)
	}
	rec, err := regions.Decode([]byte(sh.Value))
	if err != nil {
		return Share{}, err
	}
	return Share{Record: rec, Version: ver}, nil
}

// PutShare writes rec as the share record of entity's bucket for
// resource, on the condition that the stored one is still at version (0:
// that none is stored), and returns the new version. ttl (epoch seconds,
// 0 for none) lets DynamoDB delete the item once its loans are over; an
// item past it that DynamoDB has not deleted yet holds only ended loans,
// which enforce the base, as no item does. A lost condition is
// ErrShareChanged.
func (a *Admin) PutShare(ctx context.Context, entity, resource string, rec regions.Record, version, ttl int64) (int64, error) {
	av, err := a.shareKey(entity, resource)
	if err != nil {
		return 0, err
	}
	b, err := regions.Encode(rec)
	if err != nil {
		return 0, fmt.Errorf("the share of %q/%q: %w", entity, resource, err)
	}
	av[attrShare], av[attrShareVer] = str(string(b)), num(version+1)
	if ttl > 0 {
		av[attrTTL] = num(ttl)
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
			return 0, fmt.Errorf("the share of %q/%q at version %d: %w", entity, resource, version, ErrShareChanged)
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
	if len(out.Item) == 0 {
		return regions.Record{}, nil
	}
	s, err := decodeShare(out.Item)
	if err != nil {
		return regions.Record{}, fmt.Errorf("the share of %q/%q: %w", entity, resource, err)
	}
	return s.Record, nil
}
