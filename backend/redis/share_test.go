package redis

import (
	"context"
	"errors"
	"testing"

	"github.com/sluice-rl/sluice/backend/backendtest"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
	"github.com/sluice-rl/sluice/regions"
)

// TestShareRecords: the share record of a global key is written only
// over the version it was planned from, expires when asked, and reads
// back as written; a damaged one is an error, not "none".
func TestShareRecords(t *testing.T) {
	srv := redistest.Require(t)
	a := newAdmin(t, newClient(t, srv), "shares", nil)
	ctx := context.Background()
	if _, v, err := a.GetShare(ctx, "tenant-1", "api"); v != 0 || err != nil {
		t.Fatalf("before any write: found version %d, %v", v, err)
	}
	rec := regions.Record{In: map[regions.Region]regions.Loans{"us-east-1": {{Made: 10, From: 11, To: 14, Parts: 250_000, Back: 13}}}}
	v, err := a.PutShare(ctx, "tenant-1", "api", rec, 0, 0)
	if err != nil || v != 1 {
		t.Fatalf("first write: version %d, %v", v, err)
	}
	if got, ver, err := a.GetShare(ctx, "tenant-1", "api"); err != nil || ver != 1 || !got.Equal(rec) {
		t.Fatalf("read back %+v at version %d (%v), want %+v at version 1", got, ver, err, rec)
	}
	if _, err := a.PutShare(ctx, "tenant-1", "api", regions.Record{}, 0, 0); !errors.Is(err, regions.ErrShareChanged) {
		t.Errorf("a write planned from no record over version 1: %v, want ErrShareChanged", err)
	}
	if v, err = a.PutShare(ctx, "tenant-1", "api", rec, 1, 4_000_000_000_000); err != nil || v != 2 {
		t.Fatalf("second write: version %d, %v", v, err)
	}
	if ms, err := srv.Do(ctx, "PEXPIRETIME", a.keys.Share("tenant-1", "api")); err != nil || ms != "4000000000000" {
		t.Errorf("the record expires at %v (%v), want 4000000000000", ms, err)
	}
	if _, err := srv.Do(ctx, "HSET", a.keys.Share("tenant-2", "api"), "ver", "1", "sh", `{"v":1,"i":{"us":[[1,2,3,4]]}}`); err != nil {
		t.Fatal(err)
	}
	if _, v, err := a.GetShare(ctx, "tenant-2", "api"); err == nil || v != 0 {
		t.Errorf("a damaged record read at version %d, %v; want an error", v, err)
	}
}

// TestSharesInBatches: a sync's pipelined reads of share records read
// what one read per key would (backendtest.SharesInBatches).
func TestSharesInBatches(t *testing.T) {
	srv := redistest.Require(t)
	a := newAdmin(t, newClient(t, srv), "batches", nil)
	backendtest.SharesInBatches(t, a, func(entity, resource string) {
		if _, err := srv.Do(context.Background(), "HSET", a.keys.Share(entity, resource), "ver", "1", "sh", `{"v":1,"i":{"us":[[1,2,3,4]]}}`); err != nil {
			t.Fatal(err)
		}
	})
}
