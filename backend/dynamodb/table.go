package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// TableAPI is the part of *dynamodb.Client that CreateTable and CheckTable
// use.
type TableAPI interface {
	CreateTable(context.Context, *ddb.CreateTableInput, ...func(*ddb.Options)) (*ddb.CreateTableOutput, error)
	DescribeTable(context.Context, *ddb.DescribeTableInput, ...func(*ddb.Options)) (*ddb.DescribeTableOutput, error)
	UpdateTimeToLive(context.Context, *ddb.UpdateTimeToLiveInput, ...func(*ddb.Options)) (*ddb.UpdateTimeToLiveOutput, error)
	DescribeTimeToLive(context.Context, *ddb.DescribeTimeToLiveInput, ...func(*ddb.Options)) (*ddb.DescribeTimeToLiveOutput, error)
}

// defaultActiveWait bounds the wait for a new table to become ACTIVE when
// ctx has no deadline.
const defaultActiveWait = 10 * time.Minute

// keyElem is one attribute of a key: its name, role and type.
type keyElem struct {
	name string
	role types.KeyType
}

func (k keyElem) String() string { return fmt.Sprintf("%s (%s, S)", k.name, k.role) }

// The table's keys (DESIGN section 6): every key attribute is a string.
func tableKey() []keyElem {
	return []keyElem{{attrPK, types.KeyTypeHash}, {attrSK, types.KeyTypeRange}}
}

// indexNames lists the global secondary indexes, in creation order.
func indexNames() []string { return []string{indexGSI1, indexGSI2} }

// indexKey is the key of index idx.
func indexKey(idx string) []keyElem {
	if idx == indexGSI1 {
		return []keyElem{{attrGSI1PK, types.KeyTypeHash}, {attrGSI1SK, types.KeyTypeRange}}
	}
	return []keyElem{{attrGSI2PK, types.KeyTypeHash}, {attrGSI2SK, types.KeyTypeRange}}
}

// indexProjection is what each index carries. GSI1 (parent -> children)
// indexes META items, written rarely: all attributes. GSI2 (resource ->
// buckets) indexes every bucket item, written on every decision: it
// carries only attributes a decision never changes, so a token update
// does not also write the index (which would double its write units).
func indexProjection(idx string) *types.Projection {
	if idx == indexGSI2 {
		return &types.Projection{ProjectionType: types.ProjectionTypeInclude,
			NonKeyAttributes: []string{attrEntity, attrResource, attrCfg}}
	}
	return &types.Projection{ProjectionType: types.ProjectionTypeAll}
}

// createTableInput is the table Sluice needs: PK+SK, GSI1 and GSI2 (see
// indexProjection), on-demand billing.
func createTableInput(name string) *ddb.CreateTableInput {
	in := &ddb.CreateTableInput{
		TableName:   aws.String(name),
		BillingMode: types.BillingModePayPerRequest,
		KeySchema:   keySchema(tableKey()),
	}
	for _, k := range tableKey() {
		in.AttributeDefinitions = append(in.AttributeDefinitions, attrDef(k.name))
	}
	for _, idx := range indexNames() {
		for _, k := range indexKey(idx) {
			in.AttributeDefinitions = append(in.AttributeDefinitions, attrDef(k.name))
		}
		in.GlobalSecondaryIndexes = append(in.GlobalSecondaryIndexes, types.GlobalSecondaryIndex{
			IndexName:  aws.String(idx),
			KeySchema:  keySchema(indexKey(idx)),
			Projection: indexProjection(idx),
		})
	}
	return in
}

func keySchema(key []keyElem) []types.KeySchemaElement {
	out := make([]types.KeySchemaElement, len(key))
	for i, k := range key {
		out[i] = types.KeySchemaElement{AttributeName: aws.String(k.name), KeyType: k.role}
	}
	return out
}

func attrDef(name string) types.AttributeDefinition {
	return types.AttributeDefinition{AttributeName: aws.String(name), AttributeType: types.ScalarAttributeTypeS}
}

// CreateTable creates the table Sluice stores buckets and configs in
// (DESIGN section 6), waits until it is ACTIVE and enables TTL on the ttl
// attribute. It is idempotent: a table that exists with the right keys and
// indexes is kept (created is false) and TTL is still ensured; one that
// exists with other keys or indexes is an error naming the differences.
func CreateTable(ctx context.Context, api TableAPI, name string) (created bool, err error) {
	if name == "" {
		return false, errors.New("create table: no table name")
	}
	_, err = api.CreateTable(ctx, createTableInput(name))
	var inUse *types.ResourceInUseException
	switch {
	case err == nil:
		created = true
	case errors.As(err, &inUse):
		// It exists (or is being created or deleted): check it below.
	default:
		return false, fmt.Errorf("create table %q: %w", name, err)
	}
	desc, err := waitActive(ctx, api, name)
	if err != nil {
		return created, fmt.Errorf("create table %q: %w", name, err)
	}
	if !created {
		if diffs := schemaDiffs(desc); len(diffs) > 0 {
			return false, fmt.Errorf("table %q exists but is not a Sluice table: %s", name, strings.Join(diffs, "; "))
		}
	}
	if err := ensureTTL(ctx, api, name); err != nil {
		return created, fmt.Errorf("table %q: %w", name, err)
	}
	return created, nil
}

// waitActive polls DescribeTable until the table is ACTIVE, for as long as
// ctx allows (defaultActiveWait when it has no deadline).
func waitActive(ctx context.Context, api TableAPI, name string) (*types.TableDescription, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultActiveWait)
		defer cancel()
	}
	delay := 250 * time.Millisecond
	for {
		out, err := api.DescribeTable(ctx, &ddb.DescribeTableInput{TableName: aws.String(name)})
		var notFound *types.ResourceNotFoundException
		switch {
		case errors.As(err, &notFound):
			// Eventually consistent right after CreateTable: try again.
		case err != nil:
			return nil, fmt.Errorf("describe table: %w", err)
		case out.Table == nil:
			return nil, errors.New("describe table: no table in the answer")
		default:
			switch st := out.Table.TableStatus; st {
			case types.TableStatusActive:
				return out.Table, nil
			case types.TableStatusCreating, types.TableStatusUpdating:
				// Wait.
			default:
				return nil, fmt.Errorf("table status is %s", st)
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the table to become ACTIVE: %w", ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// ensureTTL enables DynamoDB's TTL on the ttl attribute unless it is
// already on.
func ensureTTL(ctx context.Context, api TableAPI, name string) error {
	out, err := api.DescribeTimeToLive(ctx, &ddb.DescribeTimeToLiveInput{TableName: aws.String(name)})
	if err != nil {
		return fmt.Errorf("describe time to live: %w", err)
	}
	if d := out.TimeToLiveDescription; d != nil {
		switch d.TimeToLiveStatus {
		case types.TimeToLiveStatusEnabled, types.TimeToLiveStatusEnabling:
			if attr := aws.ToString(d.AttributeName); attr != attrTTL {
				return fmt.Errorf("TTL is enabled on attribute %q; Sluice needs it on %q: disable it first", attr, attrTTL)
			}
			return nil
		}
	}
	_, err = api.UpdateTimeToLive(ctx, &ddb.UpdateTimeToLiveInput{
		TableName: aws.String(name),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(attrTTL),
			Enabled:       aws.Bool(true),
		},
	})
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) && strings.Contains(strings.ToLower(apiErr.ErrorMessage()), "already enabled") {
		return nil // enabled meanwhile, by someone else
	}
	if err != nil {
		return fmt.Errorf("enable TTL on attribute %q: %w", attrTTL, err)
	}
	return nil
}

// CheckTable verifies that the table exists, is usable and has Sluice's
// keys and indexes. A missing table is an error that names the command
// creating it.
func CheckTable(ctx context.Context, api TableAPI, name string) error {
	if name == "" {
		return errors.New("check table: no table name")
	}
	out, err := api.DescribeTable(ctx, &ddb.DescribeTableInput{TableName: aws.String(name)})
	var notFound *types.ResourceNotFoundException
	if errors.As(err, &notFound) {
		return fmt.Errorf("DynamoDB table %q does not exist; run: sluice table create --table %s (with the same --region and --endpoint): %w",
			name, name, err)
	}
	if err != nil {
		return fmt.Errorf("check table %q: %w", name, err)
	}
	if out.Table == nil {
		return fmt.Errorf("check table %q: no table in the answer", name)
	}
	switch st := out.Table.TableStatus; st {
	case types.TableStatusActive, types.TableStatusUpdating:
	default:
		return fmt.Errorf("table %q is %s, not ACTIVE", name, st)
	}
	if diffs := schemaDiffs(out.Table); len(diffs) > 0 {
		return fmt.Errorf("table %q is not a Sluice table: %s", name, strings.Join(diffs, "; "))
	}
	return nil
}

// schemaDiffs says how the table's keys and indexes differ from what
// Sluice needs; nothing when they match. Billing, throughput, TTL and any
// further indexes are the operator's business.
func schemaDiffs(t *types.TableDescription) []string {
	attrTypes := map[string]types.ScalarAttributeType{}
	for _, a := range t.AttributeDefinitions {
		attrTypes[aws.ToString(a.AttributeName)] = a.AttributeType
	}
	var diffs []string
	if d := keyDiff(t.KeySchema, tableKey(), attrTypes); d != "" {
		diffs = append(diffs, "key schema: "+d)
	}
	indexes := map[string]int{}
	for i, g := range t.GlobalSecondaryIndexes {
		indexes[aws.ToString(g.IndexName)] = i
	}
	for _, idx := range indexNames() {
		i, ok := indexes[idx]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("global secondary index %s is missing (want %s)", idx, formatKey(indexKey(idx))))
			continue
		}
		g := t.GlobalSecondaryIndexes[i]
		if d := keyDiff(g.KeySchema, indexKey(idx), attrTypes); d != "" {
			diffs = append(diffs, fmt.Sprintf("index %s: %s", idx, d))
		}
		if d := projectionDiff(g.Projection, indexProjection(idx)); d != "" {
			diffs = append(diffs, fmt.Sprintf("index %s: %s", idx, d))
		}
	}
	return diffs
}

// keyDiff compares a key schema with the wanted one; "" when they match.
func keyDiff(have []types.KeySchemaElement, want []keyElem, attrTypes map[string]types.ScalarAttributeType) string {
	match := len(have) == len(want)
	var got []string
	for i, k := range have {
		name := aws.ToString(k.AttributeName)
		typ := attrTypes[name]
		got = append(got, fmt.Sprintf("%s (%s, %s)", name, k.KeyType, typ))
		if i < len(want) && (name != want[i].name || k.KeyType != want[i].role || typ != types.ScalarAttributeTypeS) {
			match = false
		}
	}
	if match {
		return ""
	}
	return fmt.Sprintf("have %s, want %s", strings.Join(got, " + "), formatKey(want))
}

func formatKey(key []keyElem) string {
	s := make([]string, len(key))
	for i, k := range key {
		s[i] = k.String()
	}
	return strings.Join(s, " + ")
}

// projectionDiff compares an index's projection with the wanted one; ""
// when they match.
func projectionDiff(have, want *types.Projection) string {
	describe := func(p *types.Projection) string {
		if p == nil {
			return "none"
		}
		if p.ProjectionType != types.ProjectionTypeInclude {
			return string(p.ProjectionType)
		}
		attrs := slices.Clone(p.NonKeyAttributes)
		slices.Sort(attrs)
		return fmt.Sprintf("INCLUDE %s", strings.Join(attrs, ", "))
	}
	if h, w := describe(have), describe(want); h != w {
		return fmt.Sprintf("projection is %s, want %s", h, w)
	}
	return ""
}
