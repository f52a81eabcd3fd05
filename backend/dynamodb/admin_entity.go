package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// metaItem is the META item of e.
func metaItem(keys Keys, e backend.Entity) map[string]types.AttributeValue {
	av := map[string]types.AttributeValue{
		attrPK: str(keys.EntityPK(e.Name)), attrSK: str(MetaSK()), attrEntity: str(e.Name),
		attrCascade: &types.AttributeValueMemberBOOL{Value: e.Cascade},
	}
	if e.Parent != "" {
		av[attrParent] = str(e.Parent)
		av[attrGSI1PK] = str(keys.GSI1PK(e.Parent))
		av[attrGSI1SK] = str(GSI1SK(e.Name))
	}
	return av
}

func decodeEntity(av map[string]types.AttributeValue) backend.Entity {
	c, _ := av[attrCascade].(*types.AttributeValueMemberBOOL)
	return backend.Entity{Name: attrS(av, attrEntity), Parent: attrS(av, attrParent), Cascade: c != nil && c.Value}
}

// PutEntity writes e's META item, replacing what was there.
func (a *Admin) PutEntity(ctx context.Context, e backend.Entity) error {
	if err := e.Validate(); err != nil {
		return err
	}
	if _, err := a.api.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(a.table), Item: metaItem(a.keys, e)}); err != nil {
		return fmt.Errorf("writing META of %q: %w", e.Name, err)
	}
	return nil
}

// GetEntity reads name's META item.
func (a *Admin) GetEntity(ctx context.Context, name string) (backend.Entity, bool, error) {
	out, err := a.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(a.table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{attrPK: str(a.keys.EntityPK(name)), attrSK: str(MetaSK())},
	})
	if err != nil {
		return backend.Entity{}, false, fmt.Errorf("reading META of %q: %w", name, err)
	}
	if len(out.Item) == 0 {
		return backend.Entity{}, false, nil
	}
	return decodeEntity(out.Item), true, nil
}

// Children calls fn for every entity whose META names parent, through
// GSI1, page by page. The index is eventually consistent: a META written
// a moment ago may be missing.
func (a *Admin) Children(ctx context.Context, parent string, fn func(backend.Entity) error) error {
	err := a.query(ctx, &dynamodb.QueryInput{
		IndexName:                 aws.String(indexGSI1),
		KeyConditionExpression:    aws.String("#pk = :pk"),
		ExpressionAttributeNames:  map[string]string{"#pk": attrGSI1PK},
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": str(a.keys.GSI1PK(parent))},
	}, func(av map[string]types.AttributeValue) error { return fn(decodeEntity(av)) })
	if err != nil {
		return fmt.Errorf("children of %q: %w", parent, err)
	}
	return nil
}

// DeleteEntity deletes every item of entity (its META, configs and
// buckets, not its share records) and returns how many it deleted. It reads the keys page by page
// and deletes them 25 at a time, asking again for what DynamoDB leaves
// unprocessed, within ctx and maxBatchAttempts calls a batch.
func (a *Admin) DeleteEntity(ctx context.Context, entity string) (int, error) {
	var keys []map[string]types.AttributeValue
	err := a.query(ctx, &dynamodb.QueryInput{
		KeyConditionExpression:    aws.String("#pk = :pk"),
		ProjectionExpression:      aws.String("#pk, #sk"),
		ExpressionAttributeNames:  map[string]string{"#pk": attrPK, "#sk": attrSK},
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": str(a.keys.EntityPK(entity))},
		ConsistentRead:            aws.Bool(true),
	}, func(av map[string]types.AttributeValue) error {
		// A share record is the sync's: the loans in it stay lent in
		// other regions until they end, which its ttl follows.
		if !strings.HasPrefix(attrS(av, attrSK), shareSKMarker) {
			keys = append(keys, primaryKey(av))
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("items of entity %q: %w", entity, err)
	}
	deleted := 0
	for len(keys) > 0 {
		n := min(len(keys), 25)
		if err := a.deleteBatch(ctx, keys[:n]); err != nil {
			return deleted, fmt.Errorf("deleting entity %q: %w", entity, err)
		}
		deleted += n
		keys = keys[n:]
	}
	return deleted, nil
}

// maxBatchAttempts bounds the calls one batch of the Admin takes, the
// first included, before it gives up on items left unprocessed.
const maxBatchAttempts = 10

func (a *Admin) deleteBatch(ctx context.Context, keys []map[string]types.AttributeValue) error {
	reqs := make([]types.WriteRequest, len(keys))
	for i, k := range keys {
		reqs[i] = types.WriteRequest{DeleteRequest: &types.DeleteRequest{Key: k}}
	}
	pending := map[string][]types.WriteRequest{a.table: reqs}
	for attempt := 0; len(pending[a.table]) > 0; attempt++ {
		if attempt == maxBatchAttempts {
			return fmt.Errorf("%d items still unprocessed after %d attempts", len(pending[a.table]), attempt)
		}
		if attempt > 0 {
			if err := sleep(ctx, backoff(attempt)); err != nil {
				return err
			}
		}
		out, err := a.api.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: pending})
		if err != nil {
			return err
		}
		pending = out.UnprocessedItems
	}
	return nil
}

// GetBucket reads the bucket of entity for resource. An item whose ttl has
// passed is absent, as it is for decisions.
func (a *Admin) GetBucket(ctx context.Context, entity, resource string) (backend.Bucket, bool, error) {
	out, err := a.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(a.table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{attrPK: str(a.keys.EntityPK(entity)), attrSK: str(a.keys.BucketSK(resource))},
	})
	if err != nil {
		return backend.Bucket{}, false, fmt.Errorf("reading bucket %q/%q: %w", entity, resource, err)
	}
	it, err := decodeBucket(out.Item)
	if err != nil {
		return backend.Bucket{}, false, fmt.Errorf("bucket %q/%q: %w", entity, resource, err)
	}
	if it == nil || it.Expired(a.now()) {
		return backend.Bucket{}, false, nil
	}
	return backend.Bucket{Entity: entity, Resource: resource, Cfg: it.cfg, TTL: it.ttl, Limits: it.limits, States: it.states}, true, nil
}

// ResetBucket makes the bucket of entity for resource full again, as a
// bucket seen for the first time: every limit (limit empty: the item is
// deleted) or the one named limit (its attributes are removed; the next
// decision finds it missing and writes it full, beside the others as
// they were). It returns the bucket as it was, and false when there was
// none. Tokens replicas hold on lease stay theirs, and are spent on top
// of the full bucket.
func (a *Admin) ResetBucket(ctx context.Context, entity, resource, limit string) (backend.Bucket, bool, error) {
	b, ok, err := a.GetBucket(ctx, entity, resource)
	if err != nil || !ok {
		return b, ok, err
	}
	key := map[string]types.AttributeValue{attrPK: str(a.keys.EntityPK(entity)), attrSK: str(a.keys.BucketSK(resource))}
	if limit == "" {
		if _, err := a.api.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(a.table), Key: key}); err != nil {
			return b, true, fmt.Errorf("resetting bucket %q/%q: %w", entity, resource, err)
		}
		return b, true, nil
	}
	if !slices.ContainsFunc(b.Limits, func(l bucket.Limit) bool { return l.Name == limit }) {
		return b, true, fmt.Errorf("bucket %q/%q has no limit %q (it has %s)", entity, resource, limit, limitNames(b.Limits))
	}
	out, err := a.api.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(a.table), Key: key, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return b, true, fmt.Errorf("reading bucket %q/%q: %w", entity, resource, err)
	}
	e := newExpr()
	prefix := bucketPrefix + limit + "_"
	for attr := range out.Item {
		if rest, ok := strings.CutPrefix(attr, prefix); ok && !strings.Contains(rest, "_") {
			e.removeAttr(attr)
		}
	}
	if len(e.remove) == 0 {
		return b, true, nil
	}
	e.when("attribute_exists(%n)", []string{attrPK}, nil)
	_, err = a.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(a.table), Key: key,
		UpdateExpression: e.update(), ConditionExpression: e.condition(), ExpressionAttributeNames: e.names})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return b, true, nil // deleted meanwhile: as full as a reset makes it
	}
	if err != nil {
		return b, true, fmt.Errorf("resetting limit %q of bucket %q/%q: %w", limit, entity, resource, err)
	}
	return b, true, nil
}

// limitNames lists the names of limits, for a message.
func limitNames(limits []bucket.Limit) string {
	names := make([]string, len(limits))
	for i, l := range limits {
		names[i] = l.Name
	}
	return strings.Join(names, ", ")
}

// Buckets calls fn for every bucket of resource, through GSI2, page by
// page. The index is eventually consistent and may still list a bucket
// whose ttl has passed, until DynamoDB deletes it.
func (a *Admin) Buckets(ctx context.Context, resource string, fn func(backend.BucketRef) error) error {
	err := a.query(ctx, &dynamodb.QueryInput{
		IndexName:                 aws.String(indexGSI2),
		KeyConditionExpression:    aws.String("#pk = :pk"),
		ExpressionAttributeNames:  map[string]string{"#pk": attrGSI2PK},
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": str(a.keys.GSI2PK(resource))},
	}, func(av map[string]types.AttributeValue) error {
		return fn(backend.BucketRef{Entity: attrS(av, attrEntity), Resource: attrS(av, attrResource), Cfg: attrS(av, attrCfg)})
	})
	if err != nil {
		return fmt.Errorf("buckets of resource %q: %w", resource, err)
	}
	return nil
}

// The applied set: which records the last `sluice limits apply` wrote, so
// the next one knows what a manifest no longer lists. It is one item,
// guarded by a version number so that two applies cannot both win.
const (
	appliedSK     = "#APPLIED"
	attrRecords   = "records"
	attrVersion   = "version"
	maxAppliedLen = 300 << 10 // bytes of keys; DynamoDB items hold 400 KB
)

func (a *Admin) appliedKey() map[string]types.AttributeValue {
	return map[string]types.AttributeValue{attrPK: str(a.keys.SystemPK()), attrSK: str(appliedSK)}
}

// Applied returns the records the last apply wrote and the version to
// pass to SetApplied; version 0 means no apply has run.
func (a *Admin) Applied(ctx context.Context) ([]backend.RecordKey, int64, error) {
	out, err := a.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(a.table), Key: a.appliedKey(), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, 0, fmt.Errorf("reading the applied set: %w", err)
	}
	if len(out.Item) == 0 {
		return nil, 0, nil
	}
	var version int64
	if n, ok := out.Item[attrVersion].(*types.AttributeValueMemberN); ok {
		version, _ = strconv.ParseInt(n.Value, 10, 64)
	}
	list, _ := out.Item[attrRecords].(*types.AttributeValueMemberL)
	var refs []backend.RecordKey
	if list != nil {
		for _, v := range list.Value {
			m, ok := v.(*types.AttributeValueMemberM)
			if !ok {
				return nil, 0, fmt.Errorf("the applied set holds a %T", v)
			}
			refs = append(refs, backend.RecordKey{Entity: attrS(m.Value, attrEntity), Resource: attrS(m.Value, attrResource)})
		}
	}
	return refs, version, nil
}

// SetApplied replaces the applied set, if its version is still version;
// otherwise it returns backend.ErrAppliedChanged.
func (a *Admin) SetApplied(ctx context.Context, refs []backend.RecordKey, version int64) error {
	list := make([]types.AttributeValue, len(refs))
	size := 0
	for i, r := range refs {
		m := map[string]types.AttributeValue{}
		if r.Entity != "" {
			m[attrEntity] = str(r.Entity)
		}
		if r.Resource != "" {
			m[attrResource] = str(r.Resource)
		}
		size += len(r.Entity) + len(r.Resource) + 24
		list[i] = &types.AttributeValueMemberM{Value: m}
	}
	if size > maxAppliedLen {
		return fmt.Errorf("a manifest of %d records is too large to track (about %d KB of names; at most %d KB)", len(refs), size>>10, maxAppliedLen>>10)
	}
	item := a.appliedKey()
	item[attrRecords] = &types.AttributeValueMemberL{Value: list}
	item[attrVersion] = num(version + 1)
	in := &dynamodb.PutItemInput{TableName: aws.String(a.table), Item: item}
	if version == 0 {
		in.ConditionExpression = aws.String("attribute_not_exists(#pk)")
		in.ExpressionAttributeNames = map[string]string{"#pk": attrPK}
	} else {
		in.ConditionExpression = aws.String("#v = :v")
		in.ExpressionAttributeNames = map[string]string{"#v": attrVersion}
		in.ExpressionAttributeValues = map[string]types.AttributeValue{":v": num(version)}
	}
	_, err := a.api.PutItem(ctx, in)
	var failed *types.ConditionalCheckFailedException
	if errors.As(err, &failed) {
		return backend.ErrAppliedChanged
	}
	if err != nil {
		return fmt.Errorf("writing the applied set: %w", err)
	}
	return nil
}
