package backendtest

import (
	"context"
	"fmt"
	"testing"

	"github.com/sluice-rl/sluice/regions"
)

// ShareStore is a region's share records as a sync reads and writes them:
// a backend's Admin.
type ShareStore interface {
	GetShare(ctx context.Context, entity, resource string) (regions.Record, int64, error)
	PutShare(ctx context.Context, entity, resource string, rec regions.Record, version, expireAt int64) (int64, error)
	GetShares(ctx context.Context, keys []regions.Key, consistent bool) ([]regions.Stored, error)
}

// SharesInBatches checks GetShares against GetShare over more keys than
// one call of a store's batch reads (250): every key's record and version
// lined up with the keys asked, strongly consistent or not; a key with
// no record at version 0; a key asked twice answered twice; a key that
// names no record and one whose record damage spoils (it writes a record
// that does not decode for tenant-damaged/api) an error of their own,
// the others read all the same.
func SharesInBatches(t *testing.T, s ShareStore, damage func(entity, resource string)) {
	t.Helper()
	ctx := t.Context()
	var keys []regions.Key
	want := map[regions.Key]regions.Record{}
	for i := range 250 {
		k := regions.Key{Entity: fmt.Sprintf("tenant-%03d", i), Resource: "api"}
		keys = append(keys, k)
		if i%3 != 0 {
			continue
		}
		rec := regions.Record{Out: map[regions.Region]regions.Loans{"eu-west-1": {{Made: 10, From: 11, To: 14, Parts: int64(1000 + i)}}}}
		v, err := s.PutShare(ctx, k.Entity, k.Resource, rec, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 { // a second version
			if _, err := s.PutShare(ctx, k.Entity, k.Resource, rec, v, 0); err != nil {
				t.Fatal(err)
			}
		}
		want[k] = rec
	}
	damaged := regions.Key{Entity: "tenant-damaged", Resource: "api"}
	damage(damaged.Entity, damaged.Resource)
	keys = append(keys, damaged, keys[3], regions.Key{Entity: "", Resource: "api"})
	for _, consistent := range []bool{true, false} {
		got, err := s.GetShares(ctx, keys, consistent)
		if err != nil {
			t.Fatalf("consistent %v: %v", consistent, err)
		}
		if len(got) != len(keys) {
			t.Fatalf("consistent %v: %d records for %d keys", consistent, len(got), len(keys))
		}
		for i, k := range keys {
			rec, ver, err := s.GetShare(ctx, k.Entity, k.Resource)
			switch g := got[i]; {
			case (err != nil) != (g.Err != nil):
				t.Errorf("consistent %v, %v: GetShares says %v, GetShare %v", consistent, k, g.Err, err)
			case err != nil:
			case g.Version != ver || !g.Record.Equal(rec) || !g.Record.Equal(want[k]):
				t.Errorf("consistent %v, %v: GetShares read %+v at version %d, GetShare %+v at %d, written %+v",
					consistent, k, g.Record, g.Version, rec, ver, want[k])
			case want[k].Out == nil && ver != 0:
				t.Errorf("consistent %v, %v: no record written, read at version %d", consistent, k, ver)
			}
		}
		if got[len(keys)-3].Err == nil || got[len(keys)-1].Err == nil {
			t.Errorf("consistent %v: the damaged record and the empty key read without error: %+v, %+v", consistent, got[len(keys)-3], got[len(keys)-1])
		}
	}
}
