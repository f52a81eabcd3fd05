package dynamodb

import (
	"context"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/backendtest"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/regions"
)

// TestShareRecords writes and reads a region's share record of a global
// key as the sync will: a write on a version that moved on is refused,
// the entity's operator-written config beside it is never touched, and a
// record that does not decode is an error, not "none".
func TestShareRecords(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.admin(t, "")
	ctx := t.Context()
	if _, v, err := a.GetShare(ctx, "tenant-1", "api"); v != 0 || err != nil {
		t.Fatalf("before any write: found version %d, %v", v, err)
	}
	op := []bucket.Limit{lim(t, "rpm", "600/min", -1)}
	if _, err := a.PutConfig(ctx, backend.RecordKey{Entity: "tenant-1", Resource: "api"}, op, 0); err != nil {
		t.Fatal(err)
	}

	rec := regions.Record{Out: map[regions.Region]regions.Loans{"eu-west-1": {{Made: 10, From: 11, To: 14, Parts: 250_000}}}}
	v, err := a.PutShare(ctx, "tenant-1", "api", rec, 0, 1_800_000_000_000)
	if err != nil || v != 1 {
		t.Fatalf("first write: version %d, %v", v, err)
	}
	got, ver, err := a.GetShare(ctx, "tenant-1", "api")
	if err != nil || ver != 1 || !got.Equal(rec) {
		t.Fatalf("read back %+v at version %d (%v), want %+v at version 1", got, ver, err, rec)
	}
	if ttl := attrN(t, e.rawItem(t, a.keys.EntityPK("tenant-1"), a.keys.ShareSK("api")), attrTTL); ttl != 1_800_000_000 {
		t.Errorf("ttl %d, want 1800000000 (seconds)", ttl)
	}
	// A second sync that planned from no record, or from version 0 again.
	if _, err := a.PutShare(ctx, "tenant-1", "api", regions.Record{}, 0, 0); !errors.Is(err, regions.ErrShareChanged) {
		t.Errorf("a write planned from no record over version 1: %v, want ErrShareChanged", err)
	}
	rec.Out["eu-west-1"][0].To = 16
	if v, err = a.PutShare(ctx, "tenant-1", "api", rec, 1, 0); err != nil || v != 2 {
		t.Fatalf("second write: version %d, %v", v, err)
	}
	if _, err := a.PutShare(ctx, "tenant-1", "api", rec, 1, 0); !errors.Is(err, regions.ErrShareChanged) {
		t.Errorf("a write planned from version 1 over version 2: %v, want ErrShareChanged", err)
	}
	if c, ok, err := a.GetConfig(ctx, backend.RecordKey{Entity: "tenant-1", Resource: "api"}); err != nil || !ok || c.TTL != 0 || len(c.Limits) != 1 || c.Limits[0] != op[0] {
		t.Errorf("the operator's config after the share writes: %+v (%v, %v)", c, ok, err)
	}
	item := e.rawItem(t, a.keys.EntityPK("tenant-1"), a.keys.ShareSK("api"))
	if _, ok := item[attrTTL]; ok {
		t.Errorf("a write without ttl kept the earlier ttl: %v", item[attrTTL])
	}

	// A damaged record.
	if _, err := e.client.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(e.table), Item: map[string]types.AttributeValue{
		attrPK: str(a.keys.EntityPK("tenant-2")), attrSK: str(a.keys.ShareSK("api")),
		attrShare: str(`{"v":1,"o":{"us":[[1,2,3,-4,0]]}}`), attrShareVer: num(3),
	}}); err != nil {
		t.Fatal(err)
	}
	if _, v, err := a.GetShare(ctx, "tenant-2", "api"); err == nil || v != 0 {
		t.Errorf("a damaged record read at version %d, %v; want an error", v, err)
	}
	if _, err := a.PutShare(ctx, "tenant-2", "api", regions.Record{Out: map[regions.Region]regions.Loans{"us": {{Parts: -1}}}}, 3, 0); err == nil {
		t.Error("PutShare wrote a loan of -1 parts")
	}

	// Deleting the entity leaves the sync's record: its loans are lent
	// in other regions until they end.
	if _, err := a.DeleteEntity(ctx, "tenant-1"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := a.GetConfig(ctx, backend.RecordKey{Entity: "tenant-1", Resource: "api"}); ok {
		t.Error("DeleteEntity left the entity's config")
	}
	if s, v, err := a.GetShare(ctx, "tenant-1", "api"); err != nil || v != 2 {
		t.Errorf("DeleteEntity took the share record: %+v at version %d, %v", s, v, err)
	}
}

// TestSharesInBatches: a sync's batch reads of share records read what
// one read per key would, past BatchGetItem's hundred keys a call
// (backendtest.SharesInBatches).
func TestSharesInBatches(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.admin(t, "")
	backendtest.SharesInBatches(t, a, func(entity, resource string) {
		if _, err := e.client.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(e.table), Item: map[string]types.AttributeValue{
			attrPK: str(a.keys.EntityPK(entity)), attrSK: str(a.keys.ShareSK(resource)),
			attrShare: str(`{"v":1,"o":{"us":[[1,2,3,-4,0]]}}`), attrShareVer: num(3),
		}}); err != nil {
			t.Fatal(err)
		}
	})
}
