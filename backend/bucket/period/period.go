// Package period is the calendar arithmetic of budgets: the billing
// period (a calendar day, week, month or year in a time zone) that holds
// an instant, where it starts and where it ends, exactly, whatever the
// month's length, a leap year or a daylight-saving change does to it.
//
// Instants are epoch milliseconds, as everywhere in backend/bucket. A
// period starts at the first instant whose local date is its first day
// and ends where the next one starts, so a day is 23 or 25 hours long
// across a daylight-saving change and a month 28 to 31 days. A week is
// an ISO week: it starts on Monday.
//
// Where a zone's clock skips midnight (some zones change at 00:00), the
// day starts at the first instant that exists, the change itself. Where
// it repeats midnight (a change back across 00:00), the day starts at the
// first midnight, and the instants of the repeated hour belong to the
// later day, so that periods follow one another without a gap or an
// overlap. A date a zone skipped altogether (Pacific/Apia's 2011-12-30)
// is no period: the day before it is followed by the day after, whose
// Index is two more.
package period

import (
	"fmt"
	"strings"
	"time"
)

// Unit is the length of a billing period. The zero Unit is no period: a
// limit that refills continuously.
type Unit uint8

// The units a budget may be for.
const (
	None Unit = iota
	Day
	Week
	Month
	Year
)

// ParseUnit reads a period unit: day, week, month or year (also
// "daily", "weekly", "monthly", "yearly"), case-insensitive.
func ParseUnit(s string) (Unit, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "day", "daily":
		return Day, nil
	case "week", "weekly":
		return Week, nil
	case "month", "monthly":
		return Month, nil
	case "year", "yearly":
		return Year, nil
	}
	return None, fmt.Errorf("unknown period %q (want day, week, month or year)", s)
}

// String is the unit's name as ParseUnit reads it; "" for None.
func (u Unit) String() string {
	switch u {
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	case Year:
		return "year"
	}
	return ""
}

// Longest is the longest a period of u can last (ms): a day of 25 hours,
// a week of 7 days and an hour, a month of 31 days and an hour, a year
// of 366 days and an hour (a daylight-saving change may lengthen any of
// them by the hour it repeats; no zone changes by more than that in
// one period). Zero for None.
func (u Unit) Longest() int64 {
	const hour, day = int64(time.Hour / time.Millisecond), int64(24 * time.Hour / time.Millisecond)
	switch u {
	case Day:
		return day + hour
	case Week:
		return 7*day + hour
	case Month:
		return 31*day + hour
	case Year:
		return 366*day + hour
	}
	return 0
}

// LoadZone loads a time zone by its IANA name ("Europe/Berlin", "UTC").
// An empty name is UTC. "Local" is refused: a budget's boundary must not
// depend on the machine that computes it.
func LoadZone(name string) (*time.Location, error) {
	switch name {
	case "":
		return time.UTC, nil
	case "Local":
		return nil, fmt.Errorf("time zone %q: name a zone (Europe/Berlin, UTC), not the machine's", name)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("time zone %q does not exist: %w", name, err)
	}
	return loc, nil
}

// Bounds is the period of unit u in loc that holds instant t: its start
// (the first instant in it) and its end (the first instant of the next
// one), in epoch ms, and Index, which numbers the periods of u in order
// (days since 1970-01-01, Monday-started weeks, months or years of the
// Common Era), so that two instants' periods are Index apart. For None
// it is the whole of time, Index 0.
type Bounds struct {
	Start, End int64
	Index      int64
}

// Of returns the period of unit u in loc that holds t.
func Of(u Unit, loc *time.Location, t int64) Bounds {
	if u == None {
		return Bounds{Start: -1 << 63, End: 1<<63 - 1}
	}
	if loc == nil {
		loc = time.UTC
	}
	first := firstDay(u, localDate(loc, t))
	start := dayStart(loc, first)
	next := after(u, first)
	end := dayStart(loc, next)
	if t >= end {
		// A repeated hour across the boundary: the later period (see
		// the package comment).
		first, start = next, end
		next = after(u, first)
		end = dayStart(loc, next)
	}
	return Bounds{Start: start, End: end, Index: index(u, first)}
}

// Next returns the period n periods after b's (n >= 0).
func Next(u Unit, loc *time.Location, b Bounds, n int64) Bounds {
	if u == None || n <= 0 {
		return b
	}
	if loc == nil {
		loc = time.UTC
	}
	first := firstDay(u, localDate(loc, b.Start))
	for range n {
		first = after(u, first)
	}
	return Bounds{Start: dayStart(loc, first), End: dayStart(loc, after(u, first)), Index: index(u, first)}
}

// localDate is t's calendar date in loc, as midnight UTC of that date
// (a plain date, free of any offset).
func localDate(loc *time.Location, t int64) time.Time {
	y, m, d := time.UnixMilli(t).In(loc).Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// firstDay is the first date of the period of u that holds date d.
func firstDay(u Unit, d time.Time) time.Time {
	switch u {
	case Week:
		// ISO weeks start on Monday; Weekday counts from Sunday.
		return d.AddDate(0, 0, -((int(d.Weekday()) + 6) % 7))
	case Month:
		return time.Date(d.Year(), d.Month(), 1, 0, 0, 0, 0, time.UTC)
	case Year:
		return time.Date(d.Year(), 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return d
}

// after is the first date of the period of u after the one starting on
// first.
func after(u Unit, first time.Time) time.Time {
	switch u {
	case Week:
		return first.AddDate(0, 0, 7)
	case Month:
		// From the first of a month, so AddDate never normalizes a 31st
		// into the month after next.
		return first.AddDate(0, 1, 0)
	case Year:
		return first.AddDate(1, 0, 0)
	}
	return first.AddDate(0, 0, 1)
}

// index numbers date first's period of u.
func index(u Unit, first time.Time) int64 {
	days := first.Unix() / 86400
	switch u {
	case Week:
		// 1970-01-05 was a Monday: weeks are counted from it.
		return floorDiv(days-4, 7)
	case Month:
		return int64(first.Year())*12 + int64(first.Month()) - 1
	case Year:
		return int64(first.Year())
	}
	return days
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// dayStart is the first instant (epoch ms) whose local date in loc is d
// or later. The local midnight time.Date finds is that instant unless a
// daylight-saving change is at midnight; then the instant is searched
// for, between the earliest and the latest any UTC offset puts it.
func dayStart(loc *time.Location, d time.Time) int64 {
	y, m, dd := d.Date()
	c := time.Date(y, m, dd, 0, 0, 0, 0, loc).UnixMilli()
	if reached(loc, d, c) && !reached(loc, d, c-1) {
		return c
	}
	// Offsets lie within -24 h and +24 h of UTC, so local midnight lies
	// within a day either side of the same date's UTC midnight.
	const day = int64(24 * time.Hour / time.Millisecond)
	lo, hi := d.UnixMilli()-day-1, d.UnixMilli()+day // reached(lo) false, reached(hi) true
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if reached(loc, d, mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// reached reports whether instant t's local date in loc is d or later.
func reached(loc *time.Location, d time.Time, t int64) bool {
	return !localDate(loc, t).Before(d)
}
