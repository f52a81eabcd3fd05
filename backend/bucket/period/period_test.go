package period

import (
	"math/rand/v2"
	"testing"
	"time"
)

func zone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := LoadZone(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func at(t *testing.T, loc *time.Location, s string) int64 {
	t.Helper()
	tm, err := time.ParseInLocation("2006-01-02 15:04:05", s, loc)
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMilli()
}

func utc(t *testing.T, s string) int64 { return at(t, time.UTC, s) }

const hour = int64(time.Hour / time.Millisecond)
const day = 24 * hour

func TestBounds(t *testing.T) {
	cases := []struct {
		name       string
		zone       string
		unit       Unit
		instant    string // local
		start, end string // UTC
		length     int64
	}{
		{"plain day", "UTC", Day, "2026-12-02 15:04:05", "2026-12-02 00:00:00", "2026-12-03 00:00:00", day},
		{"Berlin day in winter", "Europe/Berlin", Day, "2026-12-02 00:30:00", "2026-12-01 23:00:00", "2026-12-02 23:00:00", day},
		{"Berlin spring forward: 23 h", "Europe/Berlin", Day, "2026-03-29 12:00:00", "2026-03-28 23:00:00", "2026-03-29 22:00:00", 23 * hour},
		{"Berlin fall back: 25 h", "Europe/Berlin", Day, "2026-10-25 12:00:00", "2026-10-24 22:00:00", "2026-10-25 23:00:00", 25 * hour},
		{"New York spring forward", "America/New_York", Day, "2026-03-08 01:59:59", "2026-03-08 05:00:00", "2026-03-09 04:00:00", 23 * hour},
		{"Havana skips midnight", "America/Havana", Day, "2023-03-12 12:00:00", "2023-03-12 05:00:00", "2023-03-13 04:00:00", 23 * hour},
		{"Santiago skips midnight", "America/Santiago", Day, "2023-09-03 12:00:00", "2023-09-03 04:00:00", "2023-09-04 03:00:00", 23 * hour},
		{"Santiago repeats the hour before midnight", "America/Santiago", Day, "2023-04-01 12:00:00", "2023-04-01 03:00:00", "2023-04-02 04:00:00", 25 * hour},
		// Cuba ends summer time at 01:00, back to 00:00: the 5th's midnight
		// comes twice, and the day starts at the first of them.
		{"Havana repeats midnight", "America/Havana", Day, "2023-11-05 12:00:00", "2023-11-05 04:00:00", "2023-11-06 05:00:00", 25 * hour},
		{"Havana the day before a repeated midnight", "America/Havana", Day, "2023-11-04 12:00:00", "2023-11-04 04:00:00", "2023-11-05 04:00:00", day},
		{"Kathmandu +05:45", "Asia/Kathmandu", Day, "2026-01-01 00:00:00", "2025-12-31 18:15:00", "2026-01-01 18:15:00", day},
		{"Apia skipped 2011-12-30: the 29th is followed by the 31st", "Pacific/Apia", Day, "2011-12-29 23:59:59", "2011-12-29 10:00:00", "2011-12-30 10:00:00", day},
		{"ISO week starts Monday", "UTC", Week, "2026-12-06 23:59:59", "2026-11-30 00:00:00", "2026-12-07 00:00:00", 7 * day},
		{"week across the new year", "UTC", Week, "2027-01-01 10:00:00", "2026-12-28 00:00:00", "2027-01-04 00:00:00", 7 * day},
		{"Berlin week with fall back", "Europe/Berlin", Week, "2026-10-25 10:00:00", "2026-10-18 22:00:00", "2026-10-25 23:00:00", 7*day + hour},
		{"February in a leap year", "UTC", Month, "2028-02-29 23:59:59", "2028-02-01 00:00:00", "2028-03-01 00:00:00", 29 * day},
		{"February otherwise", "UTC", Month, "2026-02-14 00:00:00", "2026-02-01 00:00:00", "2026-03-01 00:00:00", 28 * day},
		{"a 31-day month on the 31st", "UTC", Month, "2026-01-31 12:00:00", "2026-01-01 00:00:00", "2026-02-01 00:00:00", 31 * day},
		{"a 30-day month", "UTC", Month, "2026-04-30 23:59:59", "2026-04-01 00:00:00", "2026-05-01 00:00:00", 30 * day},
		{"Berlin March: 31 days less an hour", "Europe/Berlin", Month, "2026-03-31 23:59:59", "2026-02-28 23:00:00", "2026-03-31 22:00:00", 31*day - hour},
		{"Berlin October: 31 days and an hour", "Europe/Berlin", Month, "2026-10-01 00:00:00", "2026-09-30 22:00:00", "2026-10-31 23:00:00", 31*day + hour},
		{"leap year", "UTC", Year, "2028-12-31 23:59:59", "2028-01-01 00:00:00", "2029-01-01 00:00:00", 366 * day},
		{"Tokyo year", "Asia/Tokyo", Year, "2026-12-31 23:59:59", "2025-12-31 15:00:00", "2026-12-31 15:00:00", 365 * day},
		{"Berlin year", "Europe/Berlin", Year, "2026-06-01 00:00:00", "2025-12-31 23:00:00", "2026-12-31 23:00:00", 365 * day},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			loc := zone(t, c.zone)
			b := Of(c.unit, loc, at(t, loc, c.instant))
			if want := utc(t, c.start); b.Start != want {
				t.Errorf("start %s, want %s", time.UnixMilli(b.Start).UTC(), time.UnixMilli(want).UTC())
			}
			if want := utc(t, c.end); b.End != want {
				t.Errorf("end %s, want %s", time.UnixMilli(b.End).UTC(), time.UnixMilli(want).UTC())
			}
			if got := b.End - b.Start; got != c.length {
				t.Errorf("length %v, want %v", time.Duration(got)*time.Millisecond, time.Duration(c.length)*time.Millisecond)
			}
			if c.length > c.unit.Longest() {
				t.Errorf("%v longer than %s's Longest", c.length, c.unit)
			}
		})
	}
}

// The two instants either side of a skipped or repeated hour fall in the
// periods they should, and the first instant of each period is its
// start.
func TestEdges(t *testing.T) {
	berlin := zone(t, "Europe/Berlin")
	// 2026-03-29 02:00 local does not exist: 01:59:59.999 CET is followed
	// by 03:00 CEST.
	skip := utc(t, "2026-03-29 01:00:00")
	if a, b := Of(Day, berlin, skip-1), Of(Day, berlin, skip); a != b {
		t.Errorf("the skipped hour split a day: %v, %v", a, b)
	}
	// 2026-10-25 02:00-03:00 local happens twice.
	for _, s := range []string{"2026-10-25 00:00:00", "2026-10-25 00:59:59", "2026-10-25 01:00:00", "2026-10-25 01:59:59"} {
		if b := Of(Day, berlin, utc(t, s)); b.Start != utc(t, "2026-10-24 22:00:00") {
			t.Errorf("%s UTC: day starts %s", s, time.UnixMilli(b.Start).UTC())
		}
	}
	apia := zone(t, "Pacific/Apia")
	if a, b := Of(Day, apia, utc(t, "2011-12-30 09:59:59")), Of(Day, apia, utc(t, "2011-12-30 10:00:00")); b.Start != a.End || b.Index != a.Index+2 {
		t.Errorf("Apia's skipped date: %v then %v", a, b)
	}
	for _, u := range []Unit{Day, Week, Month, Year} {
		b := Of(u, berlin, utc(t, "2026-07-15 12:00:00"))
		if Of(u, berlin, b.Start) != b || Of(u, berlin, b.End-1) != b {
			t.Errorf("%s: its own start or last instant is in another period", u)
		}
		n := Of(u, berlin, b.End)
		if n.Start != b.End || n.Index != b.Index+1 {
			t.Errorf("%s: next period %v after %v", u, n, b)
		}
	}
}

// Over random instants in zones with daylight saving, offsets off the
// hour and the date line: every period holds its instant, follows the
// one before it with neither a gap nor an overlap, is numbered one more,
// lasts no longer than Longest, and starts at an instant whose local
// date is the period's first day, at the earliest such instant.
func TestProperty(t *testing.T) {
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "America/Santiago", "America/Havana",
		"Australia/Lord_Howe", "Asia/Kathmandu", "Pacific/Apia", "Pacific/Kiritimati", "America/St_Johns"}
	r := rand.New(rand.NewPCG(37, 4))
	lo, hi := utc(t, "1990-01-01 00:00:00"), utc(t, "2040-01-01 00:00:00")
	for _, name := range zones {
		loc := zone(t, name)
		for _, u := range []Unit{Day, Week, Month, Year} {
			for range 300 {
				x := lo + r.Int64N(hi-lo)
				b := Of(u, loc, x)
				if x < b.Start || x >= b.End {
					t.Fatalf("%s %s: %d outside its period %v", name, u, x, b)
				}
				if b.End-b.Start > u.Longest() || b.End-b.Start < u.Longest()-3*day-2*hour {
					t.Fatalf("%s %s: period of %d ms", name, u, b.End-b.Start)
				}
				prev := Of(u, loc, b.Start-1)
				if prev.End != b.Start || prev.Index != b.Index-1 {
					t.Fatalf("%s %s: %v then %v", name, u, prev, b)
				}
				if Next(u, loc, prev, 1) != b || Next(u, loc, prev, 2) != Of(u, loc, b.End) {
					t.Fatalf("%s %s: Next disagrees with Of at %v", name, u, b)
				}
				local := time.UnixMilli(b.Start).In(loc)
				if u == Week && local.Weekday() != time.Monday && time.UnixMilli(b.Start-1).In(loc).Weekday() == time.Monday {
					t.Fatalf("%s: a week starts on %s", name, local.Weekday())
				}
				if u == Month && local.Day() != 1 && time.UnixMilli(b.Start-1).In(loc).Day() != 31 && local.Month() != time.March {
					t.Fatalf("%s: a month starts on the %d", name, local.Day())
				}
			}
		}
	}
}

func TestParseUnitAndZone(t *testing.T) {
	for _, s := range []string{"day", "Week", "MONTHLY", " year "} {
		if u, err := ParseUnit(s); err != nil || u == None {
			t.Errorf("ParseUnit(%q) = %v, %v", s, u, err)
		}
	}
	for _, s := range []string{"", "hour", "minute", "quarter", "fortnight", "30d"} {
		if _, err := ParseUnit(s); err == nil {
			t.Errorf("ParseUnit(%q) accepted", s)
		}
	}
	for _, s := range []string{"Europe/Berlin", "UTC", "", "America/Argentina/Buenos_Aires"} {
		if _, err := LoadZone(s); err != nil {
			t.Errorf("LoadZone(%q): %v", s, err)
		}
	}
	for _, s := range []string{"Europe/Atlantis", "Local", "../../etc/passwd", "CEST"} {
		if _, err := LoadZone(s); err == nil {
			t.Errorf("LoadZone(%q) accepted", s)
		}
	}
}
