package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// AdminAPI is the part of *dynamodb.Client the operator's tools call.
type AdminAPI interface {
	GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(context.Context, *dynamodb.PutItemInput, ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	DeleteItem(context.Context, *dynamodb.DeleteItemInput, ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	Query(context.Context, *dynamodb.QueryInput, ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	Scan(context.Context, *dynamodb.ScanInput, ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
	BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	BatchWriteItem(context.Context, *dynamodb.BatchWriteItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error)
}

// Admin reads and writes what operators manage in the table: config
// records at every level, entities' META items, and buckets (read, and
// reset).
// It keeps no cache and reads with strong consistency, so it always shows
// the table as it is; a running Sluice sees a change within its config
// cache TTL, and a bucket takes changed limits on its next write. An Admin
// is safe for concurrent use.
type Admin struct {
	api   AdminAPI
	table string
	keys  Keys
	now   func() int64
	// pageSize caps the items of one Query or Scan page (0: DynamoDB's
	// 1 MB pages); tests make it small to walk many pages.
	pageSize int32
}

// NewAdmin returns an Admin for table under keyPrefix (as the serving
// replicas use it). now is the clock in epoch milliseconds; nil is the
// wall clock.
func NewAdmin(api AdminAPI, table, keyPrefix string, now func() int64) (*Admin, error) {
	if table == "" {
		return nil, errors.New("dynamodb: no table named")
	}
	keys, err := NewKeys(keyPrefix)
	if err != nil {
		return nil, err
	}
	if now == nil {
		now = func() int64 { return time.Now().UnixMilli() }
	}
	return &Admin{api: api, table: table, keys: keys, now: now}, nil
}

// configItemKey is the primary key of the record k and the attributes
// that name it (entity and resource, kept in the clear because keys may
// be hashed).
func configItemKey(keys Keys, k backend.RecordKey) map[string]types.AttributeValue {
	switch k.Level() {
	case backend.LevelEntity, backend.LevelEntityDefault:
		return map[string]types.AttributeValue{
			attrPK: str(keys.EntityPK(k.Entity)), attrSK: str(keys.ConfigSK(k.Resource)),
			attrEntity: str(k.Entity), attrResource: str(k.Resource),
		}
	case backend.LevelResource:
		return map[string]types.AttributeValue{
			attrPK: str(keys.ResourcePK(k.Resource)), attrSK: str(ResourceConfigSK()), attrResource: str(k.Resource),
		}
	}
	return map[string]types.AttributeValue{attrPK: str(keys.SystemPK()), attrSK: str(ResourceConfigSK())}
}

// primaryKey keeps only PK and SK of an item.
func primaryKey(av map[string]types.AttributeValue) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{attrPK: av[attrPK], attrSK: av[attrSK]}
}

// configItem is the whole item of a config record. A syncWindow > 0 marks
// an entity config as written by an automated sync (ADR-128): it expires
// at now + 3 x syncWindow unless rewritten.
func configItem(keys Keys, k backend.RecordKey, limits []bucket.Limit, syncWindow time.Duration, nowMs int64) (map[string]types.AttributeValue, int64, error) {
	if err := k.Valid(); err != nil {
		return nil, 0, err
	}
	if len(limits) == 0 {
		return nil, 0, fmt.Errorf("%s: a config needs at least one limit", k)
	}
	seen := map[string]bool{}
	for _, l := range limits {
		if err := l.Validate(); err != nil {
			return nil, 0, fmt.Errorf("%s: %w", k, err)
		}
		if seen[l.Name] {
			return nil, 0, fmt.Errorf("%s: limit %q given twice", k, l.Name)
		}
		seen[l.Name] = true
	}
	av := configItemKey(keys, k)
	var ttl int64
	if syncWindow > 0 {
		if k.Entity == "" {
			return nil, 0, fmt.Errorf("%s: only entity configs are sync-written (--sync-window)", k)
		}
		ttl = ceilSeconds(nowMs + 3*syncWindow.Milliseconds())
		av[attrTTL] = num(ttl)
	}
	encodeRecord(av, backend.Record{Limits: limits})
	return av, ttl, nil
}

// PutConfig writes the record k with limits, replacing what was there. A
// syncWindow > 0 writes a sync-written entity config (ADR-128); zero an
// operator config without ttl.
func (a *Admin) PutConfig(ctx context.Context, k backend.RecordKey, limits []bucket.Limit, syncWindow time.Duration) (backend.Config, error) {
	av, ttl, err := configItem(a.keys, k, limits, syncWindow, a.now())
	if err != nil {
		return backend.Config{}, err
	}
	if _, err := a.api.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(a.table), Item: av}); err != nil {
		return backend.Config{}, fmt.Errorf("writing %s: %w", k, err)
	}
	return backend.Config{Key: k, Limits: limits, TTL: ttl}, nil
}

// GetConfig reads the record k. A sync-written config whose ttl has passed
// is absent, as it is for decisions.
func (a *Admin) GetConfig(ctx context.Context, k backend.RecordKey) (backend.Config, bool, error) {
	if err := k.Valid(); err != nil {
		return backend.Config{}, false, err
	}
	out, err := a.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(a.table), Key: primaryKey(configItemKey(a.keys, k)), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return backend.Config{}, false, fmt.Errorf("reading %s: %w", k, err)
	}
	c, ok, err := a.decodeConfig(out.Item)
	if err != nil {
		return backend.Config{}, false, fmt.Errorf("%s: %w", k, err)
	}
	c.Key = k
	return c, ok, nil
}

// GetConfigs reads the records keys name, 100 to a BatchGetItem (its
// limit), asking again for what DynamoDB leaves unprocessed, within ctx
// and maxBatchAttempts calls a batch. The answer holds the records that
// exist; a sync-written one past its ttl does not.
func (a *Admin) GetConfigs(ctx context.Context, keys []backend.RecordKey) (map[backend.RecordKey]backend.Config, error) {
	out := make(map[backend.RecordKey]backend.Config, len(keys))
	byItem := map[[2]string]backend.RecordKey{}
	var pending []map[string]types.AttributeValue
	for _, k := range keys {
		if err := k.Valid(); err != nil {
			return nil, err
		}
		pk := primaryKey(configItemKey(a.keys, k))
		id := [2]string{attrS(pk, attrPK), attrS(pk, attrSK)}
		if _, dup := byItem[id]; !dup {
			byItem[id] = k
			pending = append(pending, pk)
		}
	}
	for len(pending) > 0 {
		n := min(len(pending), 100)
		found, err := batchGet(ctx, a.api, a.table, pending[:n], true, maxBatchAttempts, nil)
		if err != nil {
			return nil, fmt.Errorf("reading configs: %w", err)
		}
		pending = pending[n:]
		for id, av := range found {
			k := byItem[id]
			c, ok, err := a.decodeConfig(av)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			if ok {
				c.Key = k
				out[k] = c
			}
		}
	}
	return out, nil
}

// DeleteConfig deletes the record k and reports whether it existed.
func (a *Admin) DeleteConfig(ctx context.Context, k backend.RecordKey) (bool, error) {
	if err := k.Valid(); err != nil {
		return false, err
	}
	out, err := a.api.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: aws.String(a.table), Key: primaryKey(configItemKey(a.keys, k)), ReturnValues: types.ReturnValueAllOld,
	})
	if err != nil {
		return false, fmt.Errorf("deleting %s: %w", k, err)
	}
	_, existed, err := a.decodeConfig(out.Attributes)
	return existed, err
}

// decodeConfig reads a config item; its Key comes from the entity and
// resource attributes.
func (a *Admin) decodeConfig(av map[string]types.AttributeValue) (backend.Config, bool, error) {
	rec, ok, err := decodeRecord(av, a.now())
	if err != nil || !ok {
		return backend.Config{}, false, err
	}
	c := backend.Config{Key: backend.RecordKey{Entity: attrS(av, attrEntity), Resource: attrS(av, attrResource)}, Limits: rec.Limits}
	if n, ok := av[attrTTL].(*types.AttributeValueMemberN); ok {
		c.TTL, _ = strconv.ParseInt(n.Value, 10, 64) // decodeRecord checked it
	}
	return c, true, nil
}

func attrS(av map[string]types.AttributeValue, name string) string {
	if s, ok := av[name].(*types.AttributeValueMemberS); ok {
		return s.Value
	}
	return ""
}

// EntityConfigs lists the configs of entity, every resource.
func (a *Admin) EntityConfigs(ctx context.Context, entity string) ([]backend.Config, error) {
	var out []backend.Config
	err := a.query(ctx, &dynamodb.QueryInput{
		KeyConditionExpression:    aws.String("#pk = :pk AND begins_with(#sk, :sk)"),
		ExpressionAttributeNames:  map[string]string{"#pk": attrPK, "#sk": attrSK},
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": str(a.keys.EntityPK(entity)), ":sk": str(configSKMarker)},
		ConsistentRead:            aws.Bool(true),
	}, func(av map[string]types.AttributeValue) error {
		c, ok, err := a.decodeConfig(av)
		if ok {
			out = append(out, c)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("configs of entity %q: %w", entity, err)
	}
	return out, nil
}

// AllConfigs calls fn for every config record in the table under the
// Admin's prefix. It scans the whole table, buckets included, so its cost
// grows with the table: meant for audits, not for a hot path.
func (a *Admin) AllConfigs(ctx context.Context, fn func(backend.Config) error) error {
	err := a.scanSK(ctx, resourceConfig, func(av map[string]types.AttributeValue) error {
		c, ok, err := a.decodeConfig(av)
		if err != nil {
			return fmt.Errorf("config %s %s: %w", attrS(av, attrPK), attrS(av, attrSK), err)
		}
		if ok {
			return fn(c)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("scanning for configs: %w", err)
	}
	return nil
}

// scanSK calls fn for every item of this deployment (its key prefix)
// whose sort key begins with skPrefix, reading the whole table with
// strong consistency, page by page.
func (a *Admin) scanSK(ctx context.Context, skPrefix string, fn func(map[string]types.AttributeValue) error) error {
	in := &dynamodb.ScanInput{
		TableName:                 aws.String(a.table),
		FilterExpression:          aws.String("begins_with(#sk, :sk)"),
		ExpressionAttributeNames:  map[string]string{"#sk": attrSK},
		ExpressionAttributeValues: map[string]types.AttributeValue{":sk": str(skPrefix)},
		ConsistentRead:            aws.Bool(true),
	}
	if a.keys.prefix != "" {
		in.FilterExpression = aws.String("begins_with(#sk, :sk) AND begins_with(#pk, :pfx)")
		in.ExpressionAttributeNames["#pk"] = attrPK
		in.ExpressionAttributeValues[":pfx"] = str(a.keys.prefix + prefixSep)
	}
	if a.pageSize > 0 {
		in.Limit = aws.Int32(a.pageSize)
	}
	for {
		out, err := a.api.Scan(ctx, in)
		if err != nil {
			return err
		}
		for _, av := range out.Items {
			if a.keys.prefix == "" && hasPrefixSep(attrS(av, attrPK)) {
				continue // another deployment's item
			}
			if err := fn(av); err != nil {
				return err
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			return nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// hasPrefixSep reports whether a partition key carries a deployment
// prefix: only prefixed keys have a '/' before their first '#'.
func hasPrefixSep(pk string) bool {
	for i := 0; i < len(pk); i++ {
		switch pk[i] {
		case '#':
			return false
		case '/':
			return true
		}
	}
	return false
}

// query runs in against the table (or an index) and calls fn for each
// item of every page.
func (a *Admin) query(ctx context.Context, in *dynamodb.QueryInput, fn func(map[string]types.AttributeValue) error) error {
	in.TableName = aws.String(a.table)
	if a.pageSize > 0 {
		in.Limit = aws.Int32(a.pageSize)
	}
	for {
		out, err := a.api.Query(ctx, in)
		if err != nil {
			return err
		}
		for _, av := range out.Items {
			if err := fn(av); err != nil {
				return err
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			return nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// Effective resolves the limits of entity's bucket for resource through
// the four levels, from the table alone (the rule files' limits for the
// resource are not known here).
func (a *Admin) Effective(ctx context.Context, entity, resource string) (backend.Resolved, error) {
	return backend.Resolve(ctx, backend.ConfigRecords(a.GetConfig), entity, resource, nil)
}
