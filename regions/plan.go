package regions

import (
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Headroom is how much more than its demand a region's target holds, in
// percent of the demand, while the limit has room for it: demand grows
// between two windows, and a share cut to the last window's demand would
// deny its growth.
const Headroom = 25

// Horizon is how many slots from the first it may start in a loan covers
// when it is made or extended. The loans of a lender whose demand stays
// where it was are extended once every Horizon-Lead windows or so, which
// is what refreshes their records' TTL: ADR-128's three windows.
const Horizon = 4

// Targets is what each region of demand should hold, in parts, given
// what it was asked over the last slot (in parts too: the rate asked, as
// a share of the limit's). Regions missing from demand are left out and
// keep their bases: the parts planned are the bases of the regions in
// it. While their demands with Headroom fit, a region whose demand fits
// its base keeps its base and one whose demand does not gets it, from
// the others' room in proportion to how much each has; past that, the
// parts are shared in proportion to demand. So a key whose demand fits
// every region's base moves nothing. Every sync that reads the same
// demand computes the same targets; they sum to at most the planned
// parts.
func Targets(s Split, demand map[Region]int64) map[Region]int64 {
	var avail, wanted, need, room int64
	want := make(map[Region]int64, len(demand))
	for r, d := range demand {
		if !s.Has(r) {
			continue
		}
		// A demand past a hundred limits plans as a hundred: the
		// shares are the same, and the sums cannot overflow.
		w := mulDiv(min(max(d, 0), 100*Total), 100+Headroom, 100)
		want[r] = w
		wanted += w
		avail += s.Base(r)
		need += max(w-s.Base(r), 0)
		room += max(s.Base(r)-w, 0)
	}
	out := make(map[Region]int64, len(want))
	for r, w := range want {
		switch b := s.Base(r); {
		case wanted > avail:
			out[r] = mulDiv(avail, w, wanted)
		case w >= b:
			out[r] = w
		default:
			// room >= need here; rounding up what is given keeps the
			// sum within avail.
			out[r] = b - mulDivUp(b-w, need, room)
		}
	}
	return out
}

// View is what one window's sync of a region read: each region's demand
// over the last slot in parts, its own included (a region missing is
// one whose demand could not be read), and the other regions' records
// (a region missing is one whose record could not be read; one read and
// found empty is a zero Record).
type View struct {
	Demand  map[Region]int64
	Records map[Region]Record
}

// Plan is one window's step of region me's sync at now (its clock, in
// milliseconds): from its record as stored (mine) and what it read (v),
// the record to write. It copies into In every loan a lender made to me
// and it has not copied yet (or that its lender extended), and, as a
// lender, makes or extends loans from the first slot a loan written now
// may start in (Clock.FirstLoanSlot), so that each region whose target is
// above its base gets its part of what me can lend: me's base less its
// own target, spread over those regions by how far below their targets
// their bases are.
//
// A loan is changed only when the amount it should be differs from what
// is lent by more than a tenth (or by more than a thousandth of the
// limit, for small ones), and loans are made to cover Horizon slots, so
// that a key whose demand holds still costs a write every few windows.
// No loan is made that would take me's share below zero in any slot, and
// none to a region whose demand is unknown.
//
// changed reports whether next differs from mine in anything but loans
// that have ended: whether it needs writing. refused lists what Plan
// would not copy, for the sync to log and count; the rest of the plan
// stands.
func Plan(s Split, c Clock, me Region, now int64, mine Record, v View) (next Record, changed bool, refused []error) {
	if !s.Has(me) {
		return mine, false, []error{fmt.Errorf("regions: %q is not one of the limit's regions", me)}
	}
	m, f := c.At(now), c.FirstLoanSlot(now)
	// A replica may still enforce the slot before now's: keep what
	// reaches it.
	next = mine.clone(m - 1)
	stale := next.clone(m - 1) // to compare against, loans ended left out
	for _, other := range slices.Sorted(maps.Keys(v.Records)) {
		if other == me {
			continue
		}
		if err := next.copyIn(s, other, me, v.Records[other], m); err != nil {
			refused = append(refused, err)
		}
		next.takeBack(other, v.Records[other].In[me])
	}
	if _, ok := v.Demand[me]; ok {
		targets := Targets(s, v.Demand)
		next.giveBack(s, me, f, targets[me])
		next.lend(s, me, m, f, targets)
	}
	return next, !next.Equal(stale), refused
}

// maxAhead is the furthest past its own slot a lender's loan can reach
// (Lead and Horizon from a lender's clock a slot ahead, and a slot to
// spare): a loan that ends later comes from a clock far off or from a
// record no Plan wrote, and is refused.
const maxAhead = Lead + Horizon + 2

// errNotRegion refuses the record of a region the split does not have.
var errNotRegion = errors.New("not one of the limit's regions")

// copyIn copies into rec.In[lender] the loans lender's record lr makes
// to me that reach slot now or later. It refuses them all when lr cannot
// be what a Plan wrote: a loan from a region the split does not have, a
// loan with no parts or that ends before it starts, or a record that
// takes its lender's share below zero in a slot it lends to me. A loan
// rec already holds is kept as it was, but for its To, which may only
// grow: a loan once written is never changed otherwise.
func (rec *Record) copyIn(s Split, lender, me Region, lr Record, now Slot) error {
	ls := lr.Out[me]
	if len(ls) == 0 {
		return nil
	}
	if !s.Has(lender) {
		return fmt.Errorf("regions: loans from %q: %w", lender, errNotRegion)
	}
	for _, l := range ls {
		if l.Parts <= 0 || l.Parts > Total || l.To < l.From || l.To > now+maxAhead {
			return fmt.Errorf("regions: loans from %q: a loan of %d parts for slots %d to %d is not one a lender makes", lender, l.Parts, l.From, l.To)
		}
		for m := max(l.From, now); m <= l.To; m++ {
			if lr.Share(s, lender, m) < 0 {
				return fmt.Errorf("regions: loans from %q: its record lends more than its base in slot %d", lender, m)
			}
		}
	}
	have := rec.In[lender]
	for _, l := range ls {
		i := slices.IndexFunc(have, l.same)
		switch {
		case i >= 0 && have[i].Parts != l.Parts:
			return fmt.Errorf("regions: loans from %q: the loan made in slot %d from slot %d now lends %d parts, not %d", lender, l.Made, l.From, l.Parts, have[i].Parts)
		case i >= 0:
			have[i].To = max(have[i].To, l.To)
		case l.To >= now:
			have = append(have, l)
		}
	}
	rec.In[lender] = have
	return nil
}

// takeBack ends rec's loans to borrower where its record (what it holds
// from me: in) shows it gave them back: from there the borrower's
// replicas no longer use them, so me need not keep them lent.
func (rec *Record) takeBack(borrower Region, in Loans) {
	out := rec.Out[borrower]
	for _, b := range in {
		if b.Back == 0 {
			continue
		}
		if i := slices.IndexFunc(out, b.same); i >= 0 && b.Back >= out[i].From && (out[i].Back == 0 || b.Back < out[i].Back) {
			out[i].Back = b.Back
		}
	}
}

// giveBack gives back, from slot f, loans made to me that its target no
// longer needs: the latest-made first, while what is left still covers
// the target in slot f and the next. A loan given back is used no more
// from f on; its lender, once it reads that, lends it no more either.
func (rec *Record) giveBack(s Split, me Region, f Slot, target int64) {
	for _, lender := range slices.Sorted(maps.Keys(rec.In)) {
		ls := rec.In[lender]
		for i := len(ls) - 1; i >= 0; i-- {
			l := &ls[i]
			if l.at(f) == 0 && l.at(f+1) == 0 {
				continue
			}
			spare := min(rec.Share(s, me, f), rec.Share(s, me, f+1)) - target
			if spare < l.Parts {
				continue
			}
			l.Back = max(f, l.From)
		}
	}
}

// hysteresis is how far the parts a loan should lend may drift from what
// is lent before the loan is changed.
func hysteresis(parts int64) int64 { return max(parts/10, Total/1000) }

// lend makes or extends rec's loans from me, from slot f on, towards
// targets; m is the slot me's sync is in.
func (rec *Record) lend(s Split, me Region, m, f Slot, targets map[Region]int64) {
	spare := s.Base(me) - targets[me]
	var deficit int64
	for r, t := range targets {
		if r != me {
			deficit += max(t-s.Base(r), 0)
		}
	}
	if spare <= 0 || deficit <= 0 {
		return
	}
	for _, r := range slices.Sorted(maps.Keys(targets)) {
		if r == me || targets[r] <= s.Base(r) {
			continue
		}
		rec.lendTo(s, me, r, m, f, mulDiv(spare, targets[r]-s.Base(r), deficit), targets[me])
	}
}

// lendTo brings what me lends borrower over the slots f to f+Horizon-1
// to parts, where it is further from it than hysteresis: it extends the
// last loan when that lends the same parts and ends just before what
// needs covering, and otherwise adds loans (made in slot m) for what is
// missing, as far as me's share allows. Loans are never shortened: where
// more is lent than parts, it stays lent to the loan's end, or until the
// borrower gives it back.
func (rec *Record) lendTo(s Split, me, borrower Region, m, f Slot, parts, keep int64) {
	ls := rec.Out[borrower]
	if len(ls) > 0 {
		if last := ls[len(ls)-1]; parts-last.Parts <= hysteresis(last.Parts) && last.Parts-parts <= hysteresis(last.Parts) {
			parts = last.Parts
		}
	}
	if parts < hysteresis(0) {
		return
	}
	// Only the first two slots must be covered now; the rest is made
	// ahead so that the next windows have nothing to write.
	if ls.At(f) >= parts-hysteresis(parts) && ls.At(f+1) >= parts-hysteresis(parts) {
		return
	}
	to := f + Horizon - 1
	for from := f; from <= to; {
		need := parts - ls.At(from)
		if need <= hysteresis(parts) {
			from++
			continue
		}
		run := from
		for run+1 <= to && parts-ls.At(run+1) == need {
			run++
		}
		last := len(ls) - 1
		extend := last >= 0 && ls[last].Parts == need && ls[last].To == from-1 && ls[last].Back == 0
		loan := Loan{Made: m, From: from, To: run, Parts: need}
		if !extend && slices.ContainsFunc(ls, loan.same) {
			break // one loan per slot made in and slot from: the next window
		}
		need = rec.room(s, me, borrower, loan, keep)
		switch {
		case need < hysteresis(0):
		case extend && need == ls[last].Parts:
			ls[last].To = run
		default:
			loan.Parts = need
			ls = append(ls, loan)
		}
		rec.Out[borrower] = ls
		from = run + 1
	}
}

// room is the most of l's parts me can lend borrower on top of what rec
// lends already without its share going below keep (or below zero, or
// lower than it is, where it is below keep already) in any slot it
// covers. While earlier loans to other regions run out, that holds new
// loans back.
func (rec *Record) room(s Split, me, borrower Region, l Loan, keep int64) int64 {
	floor := make([]int64, 0, l.To-l.From+1)
	for m := l.From; m <= l.To; m++ {
		floor = append(floor, max(min(keep, rec.Share(s, me, m)), 0))
	}
	fits := func(p int64) bool {
		saved := rec.Out[borrower]
		rec.Out[borrower] = append(slices.Clip(saved), Loan{Made: l.Made, From: l.From, To: l.To, Parts: p})
		defer func() { rec.Out[borrower] = saved }()
		for i, m := 0, l.From; m <= l.To; i, m = i+1, m+1 {
			if rec.Share(s, me, m) < floor[i] {
				return false
			}
		}
		return true
	}
	if fits(l.Parts) {
		return l.Parts
	}
	lo, hi := int64(0), l.Parts // fits(lo), not fits(hi)
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// Fits reports whether demand d of region r, with Headroom, fits r's
// base. While every region's does, Targets leaves each at its base and
// nobody lends: a sync that read every region's demand and holds no
// loans of its own has nothing to plan, and need not read the others'
// records.
func Fits(s Split, r Region, d int64) bool {
	return mulDiv(min(max(d, 0), 100*Total), 100+Headroom, 100) <= s.Base(r)
}
