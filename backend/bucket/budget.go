package bucket

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/backend/bucket/period"
)

// A budget (Limit.Calendar) is a limit that is given its amount in full
// at the start of each calendar period and does not refill in between:
// 10 million tokens a calendar month in Europe/Berlin. Everything else
// about it is a limit's: decisions, charges into debt, refunds, leases.
//
// Its state belongs to the period that holds its Clock. The first
// refill in a later period starts the new one: the clock moves to now
// and the budget is given once more, on top of what the state holds,
// capped at the budget. Debt is carried, not forgiven: a tenant whose
// last charges of May overshot by 50,000 tokens starts June with the
// budget less 50,000, so that over any run of periods the tokens used
// stay within the budgets given plus the overshoot of the requests in
// flight at the end, once (the bound of DESIGN section 16, per period
// and over all of them). Unused tokens are not carried: a new period
// starts at most full. A budget's debt is at most one budget
// (Validate), so a period repays it, and two periods or more after the
// state's a budget is full.
//
// Leases of a budget never cross a boundary: a holder stops spending
// ExpiryMargin before the period ends (LeaseEnd), so at the next
// period's start whatever is out was spent in the old period or will
// never be; the new period drops it, and starts with its whole budget
// as room. A report on a lease of the old period finds its window gone
// (Return reports false) and changes nothing.

// Periods is the period of l's calendar that holds now.
func Periods(l Limit, now int64) period.Bounds {
	return period.Of(l.Calendar, l.Zone, now)
}

// PeriodStart is the start (epoch ms) of the period of budget l that
// holds now: the instant a state clocked before it is given its budget
// again. A store that does its arithmetic in a script of its own
// receives it, so that no script does calendar arithmetic.
func PeriodStart(l Limit, now int64) int64 { return Periods(l, now).Start }

// LeaseEnd is the latest (epoch ms) a lease of l taken at now may be
// spent until: for a budget, ExpiryMargin before its period ends (the
// clocks of the writers may be that far apart), so that no token of one
// period is spent in the next; no limit for a rate.
func LeaseEnd(l Limit, now int64) int64 {
	if !l.IsBudget() {
		return 1<<63 - 1
	}
	return Periods(l, now).End - ExpiryMargin
}

// refillBudget is Refill for a budget.
func refillBudget(l Limit, s State, now int64) State {
	b := Periods(l, now)
	if s.Clock < b.Start {
		given := l.Amount
		if s.Clock < prevStart(l, b) {
			// Two periods or more: a debt is at most one budget.
			given = 2 * l.Amount
		}
		s.Out = [LeaseSlots]Out{}
		s.Tokens = min(s.Tokens+given, l.Burst)
		s.Clock = now
		s.AtRoomSince = 0
	}
	if room := Room(l, s); s.Tokens >= room {
		s.Tokens, s.Clock = room, max(s.Clock, now)
		if s.AtRoomSince == 0 {
			s.AtRoomSince = max(s.Clock, now)
		}
	} else {
		s.AtRoomSince = 0
	}
	return s
}

// prevStart is the start of the period before b.
func prevStart(l Limit, b period.Bounds) int64 {
	return period.Of(l.Calendar, l.Zone, b.Start-1).Start
}

// PrevPeriodStart is the start of the period before the one of budget l
// that holds now: a state clocked before it has seen two boundaries or
// more, and is full.
func PrevPeriodStart(l Limit, now int64) int64 { return prevStart(l, Periods(l, now)) }

// waitBudget is Wait for a budget whose state s lacks need tokens: until
// the boundary that gives enough, Never if none does.
func waitBudget(l Limit, s State, need, now int64) int64 {
	if need > l.Burst {
		return Never
	}
	b := Periods(l, now)
	if s.Clock >= b.Start && s.Tokens+l.Amount < need {
		// In debt by more than the period's budget repays.
		b = period.Next(l.Calendar, l.Zone, b, 1)
	}
	return max(b.End-now, 1)
}

// LeaseEndOf is the earliest LeaseEnd of limits: a bucket's limits lease
// together, so its leases end before the first boundary of any of its
// budgets.
func LeaseEndOf(limits []Limit, now int64) int64 {
	end := int64(1<<63 - 1)
	for _, l := range limits {
		end = min(end, LeaseEnd(l, now))
	}
	return end
}

// CalendarKey is how a store records a budget's calendar beside its
// numbers: "month/Europe/Berlin" (unit, then zone); "" for a rate.
func (l Limit) CalendarKey() string {
	if !l.IsBudget() {
		return ""
	}
	return l.Calendar.String() + "/" + l.ZoneName()
}

// ParseCalendarKey reads CalendarKey's form back; "" is a rate.
func ParseCalendarKey(s string) (period.Unit, *time.Location, error) {
	if s == "" {
		return period.None, nil, nil
	}
	unit, zone, _ := strings.Cut(s, "/")
	u, err := period.ParseUnit(unit)
	if err != nil {
		return period.None, nil, fmt.Errorf("calendar %q: %w", s, err)
	}
	loc, err := period.LoadZone(zone)
	if err != nil {
		return period.None, nil, fmt.Errorf("calendar %q: %w", s, err)
	}
	return u, loc, nil
}
