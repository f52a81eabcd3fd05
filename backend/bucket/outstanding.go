package bucket

// Tokens out on lease (DESIGN section 11) are part of a bucket's state:
// a replica that moves tokens into a lease spends them later, from its
// own memory, so until it says what it spent they count against the
// burst (State.Out, Room). Each lease is kept in a slot by the window in
// which it expires, so that the tokens of a holder that died come back
// on their own: once a window has ended, and a margin for the clocks of
// the writers has passed, every writer frees its slot (Expire). The
// holder itself stopped spending at its lease's expiry, by its own
// clock, which is never later than the end of its window.
//
// A holder reports on its lease with each write it makes (Return): of
// what it had out in a window, what it still holds comes back to the
// bucket; the rest was spent, and leaves the slot as consumption. It
// then takes its next lease into the window of its new expiry (Lend),
// together with whatever of the old one it keeps.

// LeaseSlots is how many expiry windows a limit's leases are kept in. A
// lease lasts at most two windows from its grant (LeaseWindowMs), and a
// window is freed ExpiryMargin after it ends, which is at most one
// window: a slot is always free for the newest window.
const LeaseSlots = 5

// ExpiryMargin (ms) is how long after its window ends a slot is freed.
// It covers writers' clocks up to a second apart either way: a holder
// whose clock is a second behind spends until a second after its window
// ends, and a writer a second ahead frees the slot a second early.
const ExpiryMargin = 2000

// Out is what leases hold of one limit in one expiry window.
type Out struct {
	// Window numbers the window its leases expire by (LeaseWindow); 0
	// when the slot is empty.
	Window int64
	// Tokens leased and not yet reported on, in millitokens (spent or
	// not).
	Tokens int64
}

// LeaseWindowMs is the width (ms) of the windows leases expire in, for
// leases that last up to twice horizon ms: at least ExpiryMargin, so that
// LeaseSlots windows always cover a lease's life and its margin.
func LeaseWindowMs(horizon int64) int64 {
	return max(horizon, ExpiryMargin)
}

// LeaseWindow is the window, of width w ms, that a lease expiring at e
// (ms) is kept in: the first whose end, LeaseWindow(e, w)*w, is not
// before e.
func LeaseWindow(e, w int64) int64 {
	return max(ceilDiv(e, w), 1)
}

// Expire frees, at now, the slots of s whose window of width w ended more
// than ExpiryMargin before now: their holders can no longer spend them,
// so what they hold is no longer out, and refill may fill that room
// again. The tokens themselves are not given back: whoever held them
// may have spent them. It returns what it freed.
func Expire(s State, w, now int64) (State, int64) {
	var freed int64
	for i, o := range s.Out {
		if o.Window != 0 && o.Window*w+ExpiryMargin < now {
			freed += o.Tokens
			s.Out[i] = Out{}
		}
	}
	if freed > 0 {
		// Room it cannot say was spent in, and so not refilled from the
		// past: the bucket is below its room from now.
		s.AtRoomSince = 0
	}
	return s, freed
}

// Report is a holder's account, with one of its writes, of its lease's
// tokens in one window.
type Report struct {
	// Window is the window its tokens are out in.
	Window int64
	// Out is what the store counts out for the lease there.
	Out int64
	// Back is what of Out it did not spend and gives back to the bucket;
	// Keep, what it did not spend and keeps, out again in the window of
	// its next lease (Lend). The rest of Out was spent.
	Back, Keep int64
	// First is when it first spent of Out, by the writer's clock; 0 when
	// it spent nothing or cannot say.
	First int64
}

// spent is what of r's tokens its holder spent.
func (r Report) spent() int64 { return max(r.Out-max(r.Back, 0)-max(r.Keep, 0), 0) }

// Return takes a holder's report r off s, refilled to now, the moment it
// lands: what it gives back goes back into the bucket (never above its
// Room); what it spent leaves the slot. It reports false, changing
// nothing, when s has no slot of r's window holding r.Out: the window was
// freed (Expire) and the tokens with it, so nothing comes back.
//
// Spent tokens were counted out until now, and refill stood still at a
// room they kept too small. A bucket that has stood at its room since
// before they were spent (AtRoomSince, First) is credited the refill
// that stood still since then, up to what they made room for, and
// AtRoomSince moves past the time credited: a second report, from
// another holder, is credited only the time left, never the same twice.
func Return(l Limit, s State, r Report, now int64) (State, bool) {
	if r.Out <= 0 {
		return s, r.Back <= 0
	}
	i := slotOf(s, r.Window)
	if i < 0 || s.Out[i].Tokens < r.Out {
		return s, false
	}
	since := s.AtRoomSince
	if s.Tokens < Room(l, s) {
		since = 0
	}
	// The window stays, empty, until it is freed: another writer may
	// be lending into it at once, in a store whose writes are not
	// serialized.
	s.Out[i].Tokens -= r.Out
	s.Tokens = min(s.Tokens+min(max(r.Back, 0), r.Out), Room(l, s))
	if spent := r.spent(); since != 0 && r.First != 0 && spent > 0 && l.Amount > 0 && !l.IsBudget() {
		from := max(since, r.First)
		dt, da := quantum(l)
		steps := min(max(now-from, 0)/dt, spent/da)
		s.Tokens = min(s.Tokens+steps*da, Room(l, s))
		since = from + steps*dt
	}
	// At its room once what the holder keeps is lent again (Lend).
	s.AtRoomSince = 0
	if s.Tokens >= Room(l, s)-max(r.Keep, 0) {
		s.AtRoomSince = since
	}
	return s, true
}

// AtRoom is since when s has stood at its room (State.AtRoomSince), or 0
// when it is below it: what a store keeps of a state it writes.
func AtRoom(l Limit, s State) int64 {
	if s.Tokens < Room(l, s) {
		return 0
	}
	return s.AtRoomSince
}

// Lend records that g millitokens have gone from s's tokens into a lease
// expiring in window n, and keep more that the holder kept of an earlier
// lease it reported on (Return with back zero): they are out again,
// until the new window. It reports false, changing nothing, when s holds
// fewer than g tokens or window n's slot (SlotOf) holds another window
// not yet freed, which LeaseSlots rules out for a writer that freed the
// expired ones first.
func Lend(s State, n, g, keep int64) (State, bool) {
	if g < 0 || keep < 0 || g > s.Tokens {
		return s, false
	}
	if g+keep == 0 {
		return s, true
	}
	i := SlotOf(n)
	if w := s.Out[i].Window; w != 0 && w != n {
		return s, false
	}
	s.Tokens -= g
	s.Out[i].Window = n
	s.Out[i].Tokens += g + keep
	return s, true
}

// SlotOf is the slot window n is kept in: each window has its own, so
// that writers who cannot see each other's writes lend into one slot, and
// a slot is free again before its next window comes (LeaseSlots).
func SlotOf(n int64) int { return int(n % LeaseSlots) }

// slotOf is the index of s's slot of window n, or -1.
func slotOf(s State, n int64) int {
	if i := SlotOf(n); n > 0 && s.Out[i].Window == n {
		return i
	}
	return -1
}
