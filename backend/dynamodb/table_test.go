package dynamodb

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluice-rl/sluice/backend/dynamodb/dynamodbtest"
)

// TestMain shares one DynamoDB Local among the package's tests; it starts
// on the first dynamodbtest.Require, so tests that don't need it run
// without it.
func TestMain(m *testing.M) { dynamodbtest.Main(m) }

func TestCreateTable(t *testing.T) {
	t.Parallel()
	srv := dynamodbtest.Require(t)
	c := srv.Client(t.Context())
	name := dynamodbtest.TableName(t)

	created, err := CreateTable(t.Context(), c, name)
	if err != nil || !created {
		t.Fatalf("CreateTable: created=%v, %v", created, err)
	}
	created, err = CreateTable(t.Context(), c, name)
	if err != nil || created {
		t.Fatalf("CreateTable again: created=%v, %v; want false, nil", created, err)
	}
	if err := CheckTable(t.Context(), c, name); err != nil {
		t.Fatalf("CheckTable: %v", err)
	}

	out, err := c.DescribeTable(t.Context(), &ddb.DescribeTableInput{TableName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	tab := out.Table
	if tab.TableStatus != types.TableStatusActive {
		t.Errorf("status %s, want ACTIVE", tab.TableStatus)
	}
	if got := describeKey(tab.KeySchema); got != "PK HASH, SK RANGE" {
		t.Errorf("key schema %q", got)
	}
	attrTypes := map[string]types.ScalarAttributeType{}
	for _, a := range tab.AttributeDefinitions {
		attrTypes[aws.ToString(a.AttributeName)] = a.AttributeType
	}
	for _, a := range []string{"PK", "SK", "GSI1PK", "GSI1SK", "GSI2PK", "GSI2SK"} {
		if attrTypes[a] != types.ScalarAttributeTypeS {
			t.Errorf("attribute %s has type %q, want S", a, attrTypes[a])
		}
	}
	if tab.BillingModeSummary == nil || tab.BillingModeSummary.BillingMode != types.BillingModePayPerRequest {
		t.Errorf("billing mode %+v, want PAY_PER_REQUEST", tab.BillingModeSummary)
	}
	gsis := map[string]string{}
	for _, g := range tab.GlobalSecondaryIndexes {
		attrs := slices.Clone(g.Projection.NonKeyAttributes)
		slices.Sort(attrs)
		gsis[aws.ToString(g.IndexName)] = strings.TrimSpace(describeKey(g.KeySchema) + " / " +
			string(g.Projection.ProjectionType) + " " + strings.Join(attrs, ","))
	}
	// GSI2 indexes every bucket, written on every decision: it carries
	// only attributes a decision never changes.
	want := map[string]string{
		"GSI1": "GSI1PK HASH, GSI1SK RANGE / ALL",
		"GSI2": "GSI2PK HASH, GSI2SK RANGE / INCLUDE cfg,entity,resource",
	}
	if len(gsis) != len(want) {
		t.Errorf("indexes %v, want %v", gsis, want)
	}
	for idx, w := range want {
		if gsis[idx] != w {
			t.Errorf("index %s: %q, want %q", idx, gsis[idx], w)
		}
	}

	ttl, err := c.DescribeTimeToLive(t.Context(), &ddb.DescribeTimeToLiveInput{TableName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	if d := ttl.TimeToLiveDescription; d == nil || d.TimeToLiveStatus != types.TimeToLiveStatusEnabled || aws.ToString(d.AttributeName) != "ttl" {
		t.Errorf("time to live %+v, want ENABLED on ttl", d)
	}
}

// A table created by someone else without TTL gets it from CreateTable.
func TestCreateTableEnablesTTLOnExistingTable(t *testing.T) {
	t.Parallel()
	srv := dynamodbtest.Require(t)
	c := srv.Client(t.Context())
	name := dynamodbtest.TableName(t)
	if _, err := c.CreateTable(t.Context(), createTableInput(name)); err != nil {
		t.Fatal(err)
	}
	created, err := CreateTable(t.Context(), c, name)
	if err != nil || created {
		t.Fatalf("CreateTable: created=%v, %v; want false, nil", created, err)
	}
	ttl, err := c.DescribeTimeToLive(t.Context(), &ddb.DescribeTimeToLiveInput{TableName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	if d := ttl.TimeToLiveDescription; d == nil || d.TimeToLiveStatus != types.TimeToLiveStatusEnabled || aws.ToString(d.AttributeName) != "ttl" {
		t.Errorf("time to live %+v, want ENABLED on ttl", d)
	}
}

// The helper the package's tests get their tables from.
func TestNewTestTable(t *testing.T) {
	t.Parallel()
	srv := dynamodbtest.Require(t)
	name := srv.NewTable(t, func(ctx context.Context, c *ddb.Client, name string) error {
		_, err := CreateTable(ctx, c, name)
		return err
	})
	if err := CheckTable(t.Context(), srv.Client(t.Context()), name); err != nil {
		t.Fatal(err)
	}
	if other := dynamodbtest.TableName(t); other == name {
		t.Fatalf("TableName repeated %q", name)
	}
}

func TestCheckTableMissing(t *testing.T) {
	t.Parallel()
	srv := dynamodbtest.Require(t)
	err := CheckTable(t.Context(), srv.Client(t.Context()), "no-such-table")
	if err == nil {
		t.Fatal("CheckTable on a missing table: no error")
	}
	for _, want := range []string{`"no-such-table"`, "sluice table create --table no-such-table", "--endpoint", "--region"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	var notFound *types.ResourceNotFoundException
	if !errors.As(err, &notFound) {
		t.Errorf("error %q does not wrap ResourceNotFoundException", err)
	}
}

func TestWrongSchemaIsRejected(t *testing.T) {
	t.Parallel()
	srv := dynamodbtest.Require(t)
	c := srv.Client(t.Context())

	// Other keys altogether, and no indexes.
	other := dynamodbtest.TableName(t)
	_, err := c.CreateTable(t.Context(), &ddb.CreateTableInput{
		TableName:            aws.String(other),
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeN}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
	})
	if err != nil {
		t.Fatal(err)
	}
	created, err := CreateTable(t.Context(), c, other)
	if err == nil || created {
		t.Fatalf("CreateTable on a foreign table: created=%v, %v; want an error", created, err)
	}
	for _, want := range []string{"not a Sluice table", "key schema: have id (HASH, N), want PK (HASH, S) + SK (RANGE, S)", "GSI1 is missing", "GSI2 is missing"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if err := CheckTable(t.Context(), c, other); err == nil || !strings.Contains(err.Error(), "not a Sluice table") {
		t.Errorf("CheckTable on a foreign table: %v", err)
	}

	// The right table keys, but GSI2 keyed otherwise and GSI1 projecting
	// keys only.
	near := dynamodbtest.TableName(t)
	in := createTableInput(near)
	in.GlobalSecondaryIndexes[0].Projection.ProjectionType = types.ProjectionTypeKeysOnly
	in.GlobalSecondaryIndexes[1].KeySchema = in.GlobalSecondaryIndexes[1].KeySchema[:1]
	in.AttributeDefinitions = in.AttributeDefinitions[:len(in.AttributeDefinitions)-1] // GSI2SK, now unused
	if _, err := c.CreateTable(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	_, err = CreateTable(t.Context(), c, near)
	if err == nil {
		t.Fatal("CreateTable on a table with other indexes: no error")
	}
	for _, want := range []string{"index GSI1: projection is KEYS_ONLY, want ALL", "index GSI2: have GSI2PK (HASH, S), want GSI2PK (HASH, S) + GSI2SK (RANGE, S)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "key schema") {
		t.Errorf("error %q blames the table's key schema, which is right", err)
	}
}

// describeKey renders a key schema as "PK HASH, SK RANGE".
func describeKey(ks []types.KeySchemaElement) string {
	var s []string
	for _, k := range ks {
		s = append(s, aws.ToString(k.AttributeName)+" "+string(k.KeyType))
	}
	return strings.Join(s, ", ")
}
