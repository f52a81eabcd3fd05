package regions

import (
	"errors"
	"fmt"
)

// Slot numbers the sync windows since the Unix epoch: slot m covers
// [m*Window, (m+1)*Window) milliseconds. Every region counts the same
// slots, on its own clock.
type Slot int64

// Lead is how many slots ahead of the slot its lender writes it in a loan
// starts, at the least: a loan for slot f is written in slot f-Lead, in
// its first quarter (Clock.Deadline), so that no replica of the lender
// still holds a copy of its record from before the loan when it first
// looks at slot f (InForce looks Skew and Hold ahead).
const Lead = 1

// Clock holds the times every region of a global limit must agree on.
// The zero Clock is not valid; see Validate.
type Clock struct {
	// Window is the length of a slot in milliseconds: the sync window.
	Window int64
	// Skew is the most, in milliseconds, by which any clock of the
	// limit's replicas and syncs may be off from the true time (so two
	// of them may disagree by twice as much).
	Skew int64
	// Hold is the longest, in milliseconds, a replica keeps tokens it
	// took from its region's bucket before it spends them or gives them
	// back: its leases' lifetime. Tokens taken under one slot's share
	// and spent in the next count against both.
	Hold int64
}

// Validate reports whether c leaves a replica any time to keep a record:
// CacheFor must be positive.
func (c Clock) Validate() error {
	switch {
	case c.Window <= 0:
		return errors.New("regions: the sync window must be positive")
	case c.Skew < 0 || c.Hold < 0:
		return errors.New("regions: the clock skew and the hold time cannot be negative")
	case c.CacheFor() <= 0:
		return fmt.Errorf("regions: a sync window of %d ms leaves no time to cache a share with %d ms of clock skew and tokens held for %d ms (need a window over %d ms)",
			c.Window, c.Skew, c.Hold, (c.Skew+c.Hold)*4/3)
	}
	return nil
}

// At is the slot that holds the instant ms.
func (c Clock) At(ms int64) Slot {
	m := ms / c.Window
	if ms%c.Window < 0 {
		m--
	}
	return Slot(m)
}

// Start is the first millisecond of slot m.
func (c Clock) Start(m Slot) int64 { return int64(m) * c.Window }

// CacheFor is the longest a replica may keep a region's record (or the
// fact that there is none) before reading it again: three quarters of a
// window, less the skew and the hold time. A loan for slot f written by
// its deadline (a quarter into slot f-1, on a clock up to Skew slow) is
// then in every copy its lender's replicas hold from Hold before slot f
// truly begins: from when the tokens they take may be spent in slot f.
func (c Clock) CacheFor() int64 { return c.Window*3/4 - c.Skew - c.Hold }

// Deadline is the last millisecond at which a loan starting in slot f
// may still be written: a quarter of the way through slot f-Lead.
func (c Clock) Deadline(f Slot) int64 { return c.Start(f-Lead) + c.Window/4 }

// FirstLoanSlot is the first slot a loan written at ms may start in.
func (c Clock) FirstLoanSlot(ms int64) Slot {
	f := c.At(ms) + Lead
	if ms > c.Deadline(f) {
		f++
	}
	return f
}
