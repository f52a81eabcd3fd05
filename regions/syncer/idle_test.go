package syncer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/sluice-rl/sluice/regions"
	"github.com/sluice-rl/sluice/regions/syncer"
)

// memStore is a region's store in memory, counting the share records
// read and written.
type memStore struct {
	mu           sync.Mutex
	recs         map[regions.Key]regions.Record
	vers         map[regions.Key]int64
	usage        map[regions.Key]int64
	reads, wrote int
	calls        int // GetShares calls
}

func newMemStore() *memStore {
	return &memStore{recs: map[regions.Key]regions.Record{}, vers: map[regions.Key]int64{}, usage: map[regions.Key]int64{}}
}

func (m *memStore) GetShares(_ context.Context, keys []regions.Key, _ bool) ([]regions.Stored, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	out := make([]regions.Stored, len(keys))
	for i, k := range keys {
		m.reads++
		out[i] = regions.Stored{Record: m.recs[k], Version: m.vers[k]}
	}
	return out, nil
}

func (m *memStore) PutShare(_ context.Context, entity, resource string, rec regions.Record, version, _ int64) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := regions.Key{Entity: entity, Resource: resource}
	if m.vers[k] != version {
		return 0, regions.ErrShareChanged
	}
	m.wrote++
	m.recs[k], m.vers[k] = rec, version+1
	return version + 1, nil
}

func (m *memStore) Usage(context.Context, regions.Slot) (map[regions.Key]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[regions.Key]int64{}
	for k, v := range m.usage {
		out[k] = v
	}
	return out, nil
}

// memRegions is three regions of equal weights a, b and c, each with a
// memStore, on a clock of 10 s windows; now is a second into a window.
func memRegions(t *testing.T) (regions.Split, regions.Clock, int64, map[regions.Region]*memStore, map[regions.Region]syncer.Store) {
	t.Helper()
	split, err := regions.NewSplit(map[regions.Region]int64{"a": 1, "b": 1, "c": 1})
	if err != nil {
		t.Fatal(err)
	}
	clock := regions.Clock{Window: 10_000, Skew: 1_000, Hold: 1_000}
	stores := map[regions.Region]*memStore{}
	all := map[regions.Region]syncer.Store{}
	for _, r := range split.Regions() {
		stores[r] = newMemStore()
		all[r] = stores[r]
	}
	return split, clock, clock.Start(1_000) + 1_000, stores, all
}

// TestIdleKeysReadOnlyTheirOwnRecord: a key whose demand fits every
// region's base costs each region's sync one read of its own record a
// round, and no write; one whose demand does not is planned across the
// regions, and a region's second round reads the others' records only
// where a loan may be coming to it or it lends.
func TestIdleKeysReadOnlyTheirOwnRecord(t *testing.T) {
	split, clock, now, stores, all := memRegions(t)
	syncs := map[regions.Region]*syncer.Sync{}
	for _, r := range split.Regions() {
		syncs[r] = &syncer.Sync{Me: r, Split: split, Clock: clock, Stores: all, Budget: syncer.DefaultBudget(clock),
			Now: func() int64 { return now }}
	}
	quiet, busy := regions.Key{Entity: "quiet", Resource: "api"}, regions.Key{Entity: "busy", Resource: "api"}
	// The quiet key is asked for a fifth of the limit in each region,
	// within a third with headroom; the busy one for all of it in a.
	for _, r := range split.Regions() {
		stores[r].usage[quiet] = 200_000
	}
	counts := func() (reads, wrote int) {
		for _, s := range stores {
			reads, wrote = reads+s.reads, wrote+s.wrote
			s.reads, s.wrote = 0, 0
		}
		return
	}
	round := func(second bool, keys int) {
		t.Helper()
		for _, r := range split.Regions() {
			var res syncer.Round
			if second {
				res = syncs[r].SecondRound(context.Background())
			} else {
				res = syncs[r].Round(context.Background())
			}
			if len(res.Unread)+len(res.Refused)+len(res.Failed) > 0 || len(res.Keys) != keys {
				t.Fatalf("%s: %+v", r, res)
			}
		}
	}
	for _, c := range []struct {
		name         string
		second       bool
		keys         int
		reads, wrote int
	}{
		// The quiet key alone: each region reads its own record.
		{"quiet", false, 1, 3, 0},
		// With the busy key: it is read in every region, b and c lend
		// to a.
		{"busy", false, 2, 3 + 9, 2},
		// The second round: a copies the loans in; b and c, which lend,
		// read whether a gave any back.
		{"copy", true, 2, 3 + 9, 1},
		// A second round again: nothing new.
		{"again", true, 2, 3 + 9, 0},
	} {
		if c.name == "busy" {
			stores["a"].usage[busy] = 1_000_000
		}
		round(c.second, c.keys)
		if reads, wrote := counts(); reads != c.reads || wrote != c.wrote {
			t.Errorf("%s: %d records read and %d written, want %d and %d", c.name, reads, wrote, c.reads, c.wrote)
		}
	}
	if got := stores["a"].recs[busy].Share(split, "a", clock.At(now)+1); got != regions.Total {
		t.Errorf("a's share of the busy key next window: %d, want the whole limit", got)
	}
}

// TestRoundReadsRecordsInBatches: however many keys a round plans, each
// region's sync reads its own records in one call and every other
// region's in one call each (a store batches them as it can), not one
// call per key and region: 500 busy keys cost a round of three regions
// nine calls, where one call per record was 4,500.
func TestRoundReadsRecordsInBatches(t *testing.T) {
	split, clock, now, stores, all := memRegions(t)
	for i := range 500 {
		stores["a"].usage[regions.Key{Entity: fmt.Sprintf("busy-%d", i), Resource: "api"}] = regions.Total
	}
	var wrote int
	for _, r := range split.Regions() {
		s := &syncer.Sync{Me: r, Split: split, Clock: clock, Stores: all, Budget: syncer.DefaultBudget(clock), Now: func() int64 { return now }}
		res := s.Round(context.Background())
		if len(res.Unread)+len(res.Refused)+len(res.Failed) > 0 || len(res.Keys) != 500 {
			t.Fatalf("%s: %d keys, unread %v, refused %v, failed %v", r, len(res.Keys), res.Unread, res.Refused, res.Failed)
		}
		wrote += res.Wrote
	}
	var calls, reads int
	for _, s := range stores {
		calls, reads = calls+s.calls, reads+s.reads
	}
	if calls != 9 || reads != 4_500 || wrote != 1_000 {
		t.Errorf("%d calls read %d records, %d written; want 9 calls, 4,500 records, 1,000 written (b and c lend to a)", calls, reads, wrote)
	}
}
