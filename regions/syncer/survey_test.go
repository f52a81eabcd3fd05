package syncer_test

import (
	"context"
	"testing"

	"github.com/sluice-rl/sluice/regions"
	"github.com/sluice-rl/sluice/regions/syncer"
)

// slotStore is a memStore whose usage is kept per slot, as replicas
// write it: a slot's usage appears once written.
type slotStore struct {
	*memStore
	bySlot map[regions.Slot]map[regions.Key]int64
}

func (s slotStore) Usage(_ context.Context, slot regions.Slot) (map[regions.Key]int64, error) {
	return s.bySlot[slot], nil
}

// A survey (sluice shares) just after a slot ends, before its replicas
// have all written its usage (the sync's first round waits for them,
// Starts), lists the keys of the slot before; from the first round on,
// the slot just ended. It once listed nothing in a slot's first
// moments, and the sync test that reads shares at the end of its load
// failed in one quiet CI run of four.
func TestSurveyListsTheLastSlotWhoseUsageIsWritten(t *testing.T) {
	split, clock, _, _, _ := memRegions(t)
	used := regions.Key{Entity: "tenant", Resource: "api"}
	const m = regions.Slot(1_000)
	stores := map[regions.Region]syncer.Store{}
	for _, r := range split.Regions() {
		// Slot m-2's usage is written everywhere; m-1's nowhere yet.
		stores[r] = slotStore{newMemStore(), map[regions.Slot]map[regions.Key]int64{m - 2: {used: 300_000}}}
	}
	var now int64
	s := &syncer.Sync{Me: "a", Split: split, Clock: clock, Stores: stores, Budget: syncer.DefaultBudget(clock),
		Now: func() int64 { return now }}
	now = clock.Start(m) + 1
	rows, unread := s.Survey(context.Background(), nil)
	if len(unread) > 0 || len(rows) != 1 || rows[0].Key != used || rows[0].Demand["a"] != 300_000 {
		t.Errorf("1 ms into slot %d: %+v, unread %v; want %v with the demand of slot %d", m, rows, unread, used, m-2)
	}
	// From the first round on, the slot just ended is read: here it has
	// no usage, and nothing is listed.
	now = clock.Start(m) + s.Starts()[0]
	if rows, _ := s.Survey(context.Background(), nil); len(rows) != 0 {
		t.Errorf("at slot %d's first round: %+v, want the keys of slot %d (none)", m, rows, m-1)
	}
}
