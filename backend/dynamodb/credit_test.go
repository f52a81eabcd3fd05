package dynamodb

import (
	"context"
	"errors"
	"testing"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// A report whose spent tokens kept a bucket at its room is credited the
// refill that stood still, even when the item keeps no time at its room
// (the bucket reached it by refill since the last write): the write then
// proves the time by the item's clock and room. Once such a write has
// lost its race, its retry credits nothing from that time: every other
// writer moves the clock and the room, and a retry planned on them loses
// again for as long as others write. Seen 70 ms from the table with
// three replicas at the limit: one report lost ten races in a row while
// its spent tokens, still counted out, kept the bucket at its room.
func TestRetryCreditsNoTimeTheItemDoesNotKeep(t *testing.T) {
	l := lim(t, "x", "500/s", 500)
	const now = 1_000_000
	// 300 out on lease, 199.5 held, half a token of room left: the
	// refill reaches the room 1 ms after the clock, 200 ms before now.
	base := bucket.State{Tokens: 199_500, Clock: now - 201}
	base.Out[bucket.SlotOf(7)] = bucket.Out{Window: 7, Tokens: 300_000}
	plan := func(raced bool) target {
		t := target{
			res:       backend.Resolved{Limits: []bucket.Limit{l}},
			base:      []bucket.State{base},
			reporting: true,
			rep:       backend.LeaseReport{Window: 7, Out: []int64{300_000}, First: now - 150},
			keep:      []int64{100_000},
			lostRace:  raced,
		}
		t.pool(now)
		return t
	}
	first := plan(false)
	if first.since[0] != now-200 || first.credit[0] != 75_000 {
		t.Errorf("first attempt: at its room since %d, credit %d; want since %d (the refill's reach) and 75 tokens (150 ms from the first spend)", first.since[0], first.credit[0], now-200)
	}
	retry := plan(true)
	if retry.since[0] != now || retry.credit[0] != 0 {
		t.Errorf("retry after a lost race: at its room since %d, credit %d; want since now (%d) and no credit", retry.since[0], retry.credit[0], now)
	}
	// A time the item keeps (fieldAtRoom) is credited on a retry too:
	// its condition names only that attribute, which only credits move.
	kept := base
	kept.Tokens = 200_000
	kept.AtRoomSince = now - 180
	base = kept
	if r := plan(true); r.since[0] != now-180 || r.credit[0] != 75_000 {
		t.Errorf("retry with the time kept in the item: since %d, credit %d; want %d and 75 tokens", r.since[0], r.credit[0], now-180)
	}
}

// Calls that queued behind a write are paid from the lease it filled, in
// order; one among them whose caller has gone is answered with its
// deadline and passed over. It once sent the whole batch to the table:
// a round trip that holds the lane, for an answer nobody reads, while
// the lease had the tokens (at the limit 70 ms away, each grant was
// followed by such a write, its report keeping the lease's tokens
// counted out).
func TestBatchBehindAWriteSkipsCallsWhoseCallerIsGone(t *testing.T) {
	e := newEnv(t)
	b := e.replica(t, Options{})
	req := backend.Request{Entity: "e", Resource: "r", Defaults: []bucket.Limit{lim(t, "x", "1/hour", 1000)}, Hits: 1}
	for range 3 {
		e.clock.advance(10)
		mustDecide(t, b, req)
		waitBackground(t, b)
	}
	ts := mustTargets(t, b, &req)
	gone, cancel := context.WithCancel(t.Context())
	cancel()
	calls := []*call{newCall(t.Context(), &req, ""), newCall(gone, &req, ""), newCall(t.Context(), &req, "")}
	before := writes(b)
	b.loadSeen(ts)
	if !b.payFromLease(ts, calls) {
		t.Fatal("the lease did not answer the batch")
	}
	if w := writes(b) - before; w != 0 {
		t.Errorf("%d writes for a batch the lease pays", w)
	}
	for i, c := range calls {
		switch {
		case i == 1 && !errors.Is(c.err, context.Canceled):
			t.Errorf("call %d, its caller gone: err %v, want its context's", i, c.err)
		case i != 1 && (c.err != nil || !c.allowed):
			t.Errorf("call %d: allowed %v, err %v; want paid from the lease", i, c.allowed, c.err)
		}
	}
}
