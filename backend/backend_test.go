package backend

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/bucket/period"
)

func TestBucketTTLBySource(t *testing.T) {
	fast := bucket.Limit{Name: "fast", Amount: 10 * bucket.Milli, Period: bucket.Second, Burst: 10 * bucket.Milli}
	slow := bucket.Limit{Name: "slow", Amount: 60 * bucket.Milli, Period: bucket.Minute, Burst: 120 * bucket.Milli}
	frozen := bucket.Limit{Name: "frozen", Amount: 0, Period: bucket.Second, Burst: 5 * bucket.Milli}
	both := []bucket.Limit{fast, slow}
	// A budget fills at its boundary, at most its longest period away: a
	// bucket written at a month's first instant outlives the month even
	// at multiplier 1.
	month := bucket.Limit{Name: "month", Amount: 1000 * bucket.Milli, Period: bucket.Month, Burst: 1000 * bucket.Milli, Calendar: period.Month}
	cases := []struct {
		name  string
		r     Resolved
		mult  int64
		ttl   int64
		hasIt bool
	}{
		{"operator-written entity config never expires", Resolved{Limits: both, Level: LevelEntity, Synced: false}, 7, 0, false},
		{"sync-written entity config expires", Resolved{Limits: both, Level: LevelEntity, Synced: true}, 7, 7 * 120_000, true},
		{"entity default", Resolved{Limits: both, Level: LevelEntityDefault, Synced: false}, 7, 7 * 120_000, true},
		{"resource default", Resolved{Limits: both, Level: LevelResource, Synced: false}, 7, 7 * 120_000, true},
		{"system default", Resolved{Limits: []bucket.Limit{fast}, Level: LevelSystem, Synced: false}, 7, 7 * 1000, true},
		{"multiplier is configurable", Resolved{Limits: both, Level: LevelResource, Synced: false}, 2, 2 * 120_000, true},
		{"multiplier 0 turns TTLs off", Resolved{Limits: both, Level: LevelResource, Synced: false}, 0, 0, false},
		{"negative multiplier turns TTLs off", Resolved{Limits: both, Level: LevelResource, Synced: false}, -1, 0, false},
		{"a never-refilling burst is kept", Resolved{Limits: []bucket.Limit{fast, frozen}, Level: LevelResource, Synced: false}, 7, 0, false},
		{"a month budget beside rates", Resolved{Limits: []bucket.Limit{fast, month}, Level: LevelResource, Synced: false}, 7, 7 * (31*bucket.Day + bucket.Hour), true},
		// A budget in debt is repaid at the next boundary and full at the
		// one after: at multiplier 1 its bucket must outlive both.
		{"a month budget at multiplier 1", Resolved{Limits: []bucket.Limit{month}, Level: LevelResource, Synced: false}, 1, 2 * (31*bucket.Day + bucket.Hour), true},
		{"a month budget without debt at multiplier 1", Resolved{Limits: []bucket.Limit{noDebt(month)}, Level: LevelResource, Synced: false}, 1, 31*bucket.Day + bucket.Hour, true},
		// Below 2, the multiplied time to fill is shorter than a refill
		// from the floor (one burst below zero by default): the bucket
		// would expire in debt and the next call would find it full.
		{"multiplier 1 outlives the default debt", Resolved{Limits: both, Level: LevelResource, Synced: false}, 1, 2 * 120_000, true},
		{"multiplier 1 without debt", Resolved{Limits: []bucket.Limit{noDebt(fast), noDebt(slow)}, Level: LevelResource, Synced: false}, 1, 120_000, true},
		{"a debt of ten bursts outlasts multiplier 7", Resolved{Limits: []bucket.Limit{withDebt(slow, 10*slow.Burst)}, Level: LevelResource, Synced: false}, 7, 11 * 120_000, true},
		{"no overflow", Resolved{Limits: []bucket.Limit{{Name: "x", Amount: 1, Period: bucket.MaxPeriod, Burst: bucket.MaxTokens * bucket.Milli}}, Level: LevelResource, Synced: false}, 7, math.MaxInt64, true},
	}
	for _, c := range cases {
		ttl, ok := BucketTTL(c.r, c.mult)
		if ttl != c.ttl || ok != c.hasIt {
			t.Errorf("%s: (%d, %v), want (%d, %v)", c.name, ttl, ok, c.ttl, c.hasIt)
		}
	}
}

func noDebt(l bucket.Limit) bucket.Limit { l.Debt = bucket.NoDebt; return l }

func withDebt(l bucket.Limit, debt int64) bucket.Limit { l.Debt = debt; return l }

// records answers from maps, or fails every call with err.
type records struct {
	entity   map[[2]string]Record
	resource map[string]Record
	system   *Record
	err      error
}

func (r records) Entity(_ context.Context, e, res string) (Record, bool, error) {
	rec, ok := r.entity[[2]string{e, res}]
	return rec, ok, r.err
}

func (r records) Resource(_ context.Context, res string) (Record, bool, error) {
	rec, ok := r.resource[res]
	return rec, ok, r.err
}

func (r records) System(context.Context) (Record, bool, error) {
	if r.system == nil {
		return Record{}, false, r.err
	}
	return *r.system, true, r.err
}

func TestResolveEmptyRecordFallsThrough(t *testing.T) {
	l := []bucket.Limit{{Name: "x", Amount: bucket.Milli, Period: bucket.Second, Burst: bucket.Milli}}
	// An entity record with no limits does not win its level.
	rec := records{entity: map[[2]string]Record{{"e", "r"}: {}}, system: &Record{Limits: l}}
	got, err := Resolve(context.Background(), rec, "e", "r", nil)
	if err != nil || got.Level != LevelSystem {
		t.Fatalf("empty entity record: %+v %v", got, err)
	}
}

// Pitfall 6 in spirit: a store that cannot answer is an error, never
// "absent", so the caller's failure policy applies.
func TestResolveStoreErrorIsNotAbsent(t *testing.T) {
	rec := records{err: errors.New("throttled")}
	_, err := Resolve(context.Background(), rec, "e", "r", nil)
	if err == nil || !strings.Contains(err.Error(), "throttled") || !strings.Contains(err.Error(), `"e"`) {
		t.Fatalf("store error: %v", err)
	}
}

func TestTTLDuration(t *testing.T) {
	for _, c := range []struct {
		ms   int64
		ok   bool
		want time.Duration
	}{
		{0, false, 0},
		{420_000, true, 7 * time.Minute},
		{math.MaxInt64, true, time.Duration(math.MaxInt64/int64(time.Millisecond)) * time.Millisecond},
	} {
		if got := TTLDuration(c.ms, c.ok); got != c.want || got < 0 {
			t.Errorf("TTLDuration(%d, %v) = %v, want %v", c.ms, c.ok, got, c.want)
		}
	}
}
