package rlqs

import "testing"

// TestAheadClaimsRenewalsDueSoonOnce: a take pays for the other slots'
// renewals due within the window, never its own, none already due (they
// renew and take for themselves), none further off, and each once.
func TestAheadClaimsRenewalsDueSoonOnce(t *testing.T) {
	a := newAhead(10)
	self, soon, edge, late, past, other := &slot{}, &slot{}, &slot{}, &slot{}, &slot{}, &slot{}
	const now = 100_000
	a.book("k", self, now+100, 7)
	a.book("k", soon, now+500, 30)
	a.book("k", edge, now+aheadWindow, 20)
	a.book("k", late, now+aheadWindow+1, 1000)
	a.book("k", past, now, 1000)
	a.book("j", other, now+10, 1000)
	if got := a.claim("k", self, now); got != 50 {
		t.Fatalf("claim = %d, want 50 (the renewals due within %d ms)", got, aheadWindow)
	}
	if got := a.claim("k", late, now); got != 7 {
		t.Fatalf("second claim = %d, want 7: the first claim's renewals are paid, and only self's is left", got)
	}
	a.book("k", soon, now+500, 0)
	if got := a.claim("k", self, now); got != 0 {
		t.Fatalf("a renewal booked with no need is forgotten, but claim = %d", got)
	}
}

// TestAheadForgetsSlotsLongOverdue: a slot that never renewed (its
// stream ended) is dropped from the book once it is aheadStale overdue.
func TestAheadForgetsSlotsLongOverdue(t *testing.T) {
	a := newAhead(10)
	gone, self := &slot{}, &slot{}
	a.book("k", gone, 1000, 5)
	a.claim("k", self, 1000+aheadStale+1)
	m, _ := a.booked.Peek("k")
	if _, ok := m[gone]; ok {
		t.Fatal("a slot overdue past aheadStale is still booked")
	}
}
