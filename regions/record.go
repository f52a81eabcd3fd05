package regions

import (
	"maps"
	"math"
	"slices"
)

// Loan lends Parts of its lender's base to one borrower for the slots
// From through To. Its lender never changes it once written, but may
// extend its To: a loan its borrower has read stays good to its end,
// unless the borrower gives it back. Made (the slot its lender made it
// in) and From name it: a lender makes no two loans to one borrower with
// the same pair.
type Loan struct {
	Made, From, To Slot
	Parts          int64
	// Back, when not zero, is the first slot its borrower no longer
	// uses the loan in: the borrower gave it back from there, and its
	// lender, once it has read that, stops lending it there too.
	Back Slot
}

// at is the parts l lends for slot m.
func (l Loan) at(m Slot) int64 {
	if m < l.From || m > l.To || (l.Back != 0 && m >= l.Back) {
		return 0
	}
	return l.Parts
}

// same reports whether l and o are the same loan.
func (l Loan) same(o Loan) bool { return l.Made == o.Made && l.From == o.From }

// Loans are the loans between one lender and one borrower, in the order
// they were made. Loans may overlap: a raise in the middle of a loan is a
// second loan beside it.
type Loans []Loan

// At is the parts the loans lend for slot m, together.
func (ls Loans) At(m Slot) int64 {
	var n int64
	for _, l := range ls {
		n += l.at(m)
	}
	return n
}

// end is the last slot any of ls covers; math.MinInt64 for none.
func (ls Loans) end() Slot {
	e := Slot(math.MinInt64)
	for _, l := range ls {
		last := l.To
		if l.Back != 0 {
			last = min(last, l.Back-1)
		}
		if last >= l.From {
			e = max(e, last)
		}
	}
	return e
}

// Record is what a region's sync keeps in its own table for one global
// key, and what the region's replicas enforce: the loans the region made
// (Out) and the loans made to it that it has read (In), each by the other
// region. The zero Record holds no loans: its region enforces its base.
// A Record is a value: Plan returns a new one and leaves its input alone.
type Record struct {
	Out map[Region]Loans
	In  map[Region]Loans
}

// Share is what region r's record rec gives it in slot m, in parts: its
// base, less what it lent for slot m, plus what it was lent for slot m.
// A negative share is a record no Plan writes: a replica enforces it as 0
// (InForce), and a borrower refuses the loans of a lender whose record
// shows one.
func (rec Record) Share(s Split, r Region, m Slot) int64 {
	share := s.Base(r)
	for _, ls := range rec.Out {
		share -= ls.At(m)
	}
	for _, ls := range rec.In {
		share += ls.At(m)
	}
	return share
}

// InForce is what a replica of region r enforces under rec while its
// clock reads now (milliseconds): the smallest share of the slots from
// c.Skew before now to c.Skew+c.Hold after it. So a clock off by up to
// c.Skew never enforces more than the share of the slot it truly is, and
// tokens a replica takes now, spent up to c.Hold later, fit the share of
// the slot they are spent in too.
func (rec Record) InForce(s Split, r Region, c Clock, now int64) int64 {
	lo, hi := c.At(now-c.Skew), c.At(now+c.Skew+c.Hold)
	v := rec.Share(s, r, lo)
	for m := lo + 1; m <= hi; m++ {
		v = min(v, rec.Share(s, r, m))
	}
	return max(v, 0)
}

// Until is the last slot in which rec holds anything but its region's
// base: the end of its last loan. From the slot after, the record is no
// record; that is its TTL. A record with no loans is ended before any
// slot.
func (rec Record) Until() Slot {
	u := Slot(math.MinInt64)
	for _, ls := range rec.Out {
		u = max(u, ls.end())
	}
	for _, ls := range rec.In {
		u = max(u, ls.end())
	}
	return u
}

// clone is a deep copy of rec, without the loans that ended before slot
// keep.
func (rec Record) clone(keep Slot) Record {
	out := Record{Out: map[Region]Loans{}, In: map[Region]Loans{}}
	for r, ls := range rec.Out {
		if kept := live(ls, keep); len(kept) > 0 {
			out.Out[r] = kept
		}
	}
	for r, ls := range rec.In {
		if kept := live(ls, keep); len(kept) > 0 {
			out.In[r] = kept
		}
	}
	return out
}

// live is the loans of ls whose To is slot m or later, in a new slice.
// A loan given back before its To is kept to its To all the same: a copy
// of its lender's record read before the lender saw it given back still
// shows it lent, and the borrower must know it as given back.
func live(ls Loans, m Slot) Loans {
	var kept Loans
	for _, l := range ls {
		if l.To >= m {
			kept = append(kept, l)
		}
	}
	return kept
}

// Equal reports whether rec and o hold the same loans in the same order.
func (rec Record) Equal(o Record) bool {
	eq := func(a, b map[Region]Loans) bool {
		return maps.EqualFunc(a, b, func(x, y Loans) bool { return slices.Equal(x, y) })
	}
	return eq(rec.Out, o.Out) && eq(rec.In, o.In)
}

// Lends reports whether rec lends anything for slot m or later, as its
// lender last knew: a lender that does must read its borrowers' records
// to learn what they give back.
func (rec Record) Lends(m Slot) bool {
	for _, ls := range rec.Out {
		if ls.end() >= m {
			return true
		}
	}
	return false
}
