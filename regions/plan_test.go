package regions

import (
	"strings"
	"testing"
)

func threeWay(t *testing.T) Split {
	t.Helper()
	s, err := NewSplit(map[Region]int64{"ap": 1, "eu": 1, "us": 1})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestTargets(t *testing.T) {
	s := threeWay(t)
	for _, c := range []struct {
		name   string
		demand map[Region]int64
		want   map[Region]int64
	}{
		{"nothing asked: the bases", map[Region]int64{"ap": 0, "eu": 0, "us": 0},
			map[Region]int64{"ap": 333334, "eu": 333333, "us": 333333}},
		// Wants with headroom 250k, 125k, 0: each within its base.
		{"each within its base: the bases", map[Region]int64{"ap": 200_000, "eu": 100_000, "us": 0},
			map[Region]int64{"ap": 333334, "eu": 333333, "us": 333333}},
		// ap wants 500k: 166,666 more than its base, taken from eu's
		// room (208,333) and us's (333,333) in proportion.
		{"room for all: the one over its base gets it from the others' room", map[Region]int64{"ap": 400_000, "eu": 100_000, "us": 0},
			map[Region]int64{"ap": 500_000, "eu": 333_333 - 64_102, "us": 333_333 - 102_564}},
		// Wants 1M, 187.5k, 62.5k over a limit of 1M.
		{"over the limit: in proportion to demand", map[Region]int64{"ap": 800_000, "eu": 150_000, "us": 50_000},
			map[Region]int64{"ap": 800_000, "eu": 150_000, "us": 50_000}},
		// Only eu and us are planned, over their bases' 666,666.
		{"a region unread keeps its base", map[Region]int64{"eu": 1_000_000, "us": 0},
			map[Region]int64{"eu": 666_666, "us": 0}},
		{"absurd demand plans as a hundred limits", map[Region]int64{"ap": 1 << 62, "eu": 100 * Total, "us": 0},
			map[Region]int64{"ap": 500_000, "eu": 500_000, "us": 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Targets(s, c.demand)
			var sum, bases int64
			for r := range c.demand {
				sum += got[r]
				bases += s.Base(r)
			}
			if sum > bases {
				t.Errorf("targets %v sum to %d, over the %d planned", got, sum, bases)
			}
			for r, w := range c.want {
				if d := got[r] - w; d < -2 || d > 2 {
					t.Errorf("target of %s: %d, want %d", r, got[r], w)
				}
			}
			if len(got) != len(c.want) {
				t.Errorf("targets for %v, want only %v", got, c.want)
			}
		})
	}
}

// plan runs one window's Plan of me at the start of slot m.
func plan(t *testing.T, s Split, me Region, m Slot, mine Record, v View) (Record, bool, []error) {
	t.Helper()
	c := Clock{Window: 10_000, Skew: 1_000, Hold: 2_000}
	return Plan(s, c, me, c.Start(m), mine, v)
}

// TestPlanLendsAndBorrows follows one loan from its lender's plan into
// its borrower's record, and back out when the borrower needs it no more.
func TestPlanLendsAndBorrows(t *testing.T) {
	s := threeWay(t)
	busy := map[Region]int64{"ap": 0, "eu": 0, "us": 1_000_000}
	ap, changed, refused := plan(t, s, "ap", 10, Record{}, View{Demand: busy})
	if !changed || len(refused) > 0 {
		t.Fatalf("the idle lender wrote nothing (changed %v, refused %v)", changed, refused)
	}
	// ap keeps nothing (no demand), so all of its base goes to us from
	// slot 11, for Horizon slots.
	if got := ap.Out["us"]; len(got) != 1 || got[0] != (Loan{Made: 10, From: 11, To: 14, Parts: 333334}) {
		t.Fatalf("ap lends %v, want one loan of its base for slots 11-14", got)
	}
	if ap.Share(s, "ap", 10) != 333334 || ap.Share(s, "ap", 11) != 0 {
		t.Errorf("ap's share %d in slot 10 and %d in 11, want its base and then nothing", ap.Share(s, "ap", 10), ap.Share(s, "ap", 11))
	}
	us, _, _ := plan(t, s, "us", 10, Record{}, View{Demand: busy, Records: map[Region]Record{"ap": ap}})
	if got := us.Share(s, "us", 11); got != 333333+333334 {
		t.Errorf("us holds %d in slot 11, want its base and ap's loan", got)
	}
	// The next window, nothing has moved: neither writes.
	if _, changed, _ := plan(t, s, "ap", 11, ap, View{Demand: busy, Records: map[Region]Record{"us": us}}); changed {
		t.Error("ap wrote again with nothing changed")
	}
	// us goes quiet: it gives the loan back from slot 13, and ap, once
	// it reads that, lends it no more from there.
	quiet := map[Region]int64{"ap": 0, "eu": 0, "us": 0}
	us2, changed, _ := plan(t, s, "us", 12, us, View{Demand: quiet, Records: map[Region]Record{"ap": ap}})
	if !changed || us2.Share(s, "us", 12) != 666667 || us2.Share(s, "us", 13) != 333333 {
		t.Fatalf("us after going quiet: changed %v, shares %d and %d in slots 12 and 13; want 666667 then its base",
			changed, us2.Share(s, "us", 12), us2.Share(s, "us", 13))
	}
	ap2, _, _ := plan(t, s, "ap", 12, ap, View{Demand: quiet, Records: map[Region]Record{"us": us2}})
	if ap2.Share(s, "ap", 12) != 0 || ap2.Share(s, "ap", 13) != 333334 {
		t.Errorf("ap after us gave back: %d in slot 12 and %d in 13, want nothing and then its base", ap2.Share(s, "ap", 12), ap2.Share(s, "ap", 13))
	}
}

// TestPlanRefusesBadRecords feeds a borrower records no lender's Plan
// writes: their loans are refused with an error, and the rest stands.
func TestPlanRefusesBadRecords(t *testing.T) {
	s := threeWay(t)
	good := Record{Out: map[Region]Loans{"us": {{Made: 10, From: 11, To: 12, Parts: 1000}}}}
	for name, c := range map[string]struct {
		lender Region
		rec    Record
		why    string
	}{
		"more parts than a limit":   {"ap", Record{Out: map[Region]Loans{"us": {{Made: 10, From: 11, To: 12, Parts: Total + 1}}}}, "not one a lender makes"},
		"no parts":                  {"ap", Record{Out: map[Region]Loans{"us": {{Made: 10, From: 11, To: 12}}}}, "not one a lender makes"},
		"ends before it starts":     {"ap", Record{Out: map[Region]Loans{"us": {{Made: 10, From: 12, To: 11, Parts: 5}}}}, "not one a lender makes"},
		"far in the future":         {"ap", Record{Out: map[Region]Loans{"us": {{Made: 10, From: 11, To: 1 << 40, Parts: 5}}}}, "not one a lender makes"},
		"more than its base":        {"ap", Record{Out: map[Region]Loans{"us": {{Made: 10, From: 11, To: 12, Parts: 333335}}}}, "more than its base"},
		"a region not in the limit": {"mars", Record{Out: map[Region]Loans{"us": {{Made: 10, From: 11, To: 12, Parts: 5}}}}, "not one of the limit's regions"},
	} {
		t.Run(name, func(t *testing.T) {
			v := View{Records: map[Region]Record{c.lender: c.rec, "eu": good}}
			us, _, refused := plan(t, s, "us", 10, Record{}, v)
			if len(refused) != 1 || !strings.Contains(refused[0].Error(), c.why) {
				t.Fatalf("refused %v, want one error saying %q", refused, c.why)
			}
			if len(us.In[c.lender]) != 0 || us.Share(s, "us", 11) != 333333+1000 {
				t.Errorf("us copied %v from %s and holds %d in slot 11, want nothing from it and eu's 1000 parts", us.In[c.lender], c.lender, us.Share(s, "us", 11))
			}
		})
	}
	// A loan that changed its parts after the borrower copied it.
	us, _, _ := plan(t, s, "us", 10, Record{}, View{Records: map[Region]Record{"eu": good}})
	changed := Record{Out: map[Region]Loans{"us": {{Made: 10, From: 11, To: 12, Parts: 9000}}}}
	us2, _, refused := plan(t, s, "us", 10, us, View{Records: map[Region]Record{"eu": changed}})
	if len(refused) != 1 || us2.Share(s, "us", 11) != 333333+1000 {
		t.Errorf("a loan whose parts changed: refused %v, us holds %d; want it refused and the first copy kept", refused, us2.Share(s, "us", 11))
	}
}

// TestQuietKeyWritesRarely counts the writes of a lender and a borrower
// whose demands hold still: their loans are extended Horizon slots at a
// time, which is what keeps their records' TTL ahead.
func TestQuietKeyWritesRarely(t *testing.T) {
	s := threeWay(t)
	demand := map[Region]int64{"ap": 100_000, "eu": 300_000, "us": 500_000}
	recs := map[Region]Record{}
	writes := 0
	const windows = 60
	for m := Slot(0); m < windows; m++ {
		for _, me := range s.Regions() {
			v := View{Demand: demand, Records: map[Region]Record{}}
			for r, rec := range recs {
				if r != me {
					v.Records[r] = rec
				}
			}
			next, changed, _ := plan(t, s, me, m, recs[me], v)
			if changed {
				recs[me] = next
				if m >= 10 {
					writes++
				}
			}
		}
	}
	// Steady from slot 10: each loan is extended once every Horizon-Lead
	// windows or so, by its lender and then its borrower.
	perWindow := float64(writes) / float64(windows-10)
	if perWindow > 1.2 {
		t.Errorf("%d writes over %d steady windows (%.2f a window for the key), want at most 1.2", writes, windows-10, perWindow)
	}
	t.Logf("%d writes over %d steady windows: %.2f a window for the key, over its three regions", writes, windows-10, perWindow)
	if got := recs["us"].Share(s, "us", windows); got < 450_000 {
		t.Errorf("us holds %d at the end, want the most of its demand", got)
	}
}

// TestKeyWithinItsBasesCostsNothing: while every region's demand fits
// its base, no region lends or writes anything.
func TestKeyWithinItsBasesCostsNothing(t *testing.T) {
	s := threeWay(t)
	demand := map[Region]int64{"ap": 200_000, "eu": 0, "us": 260_000}
	recs := map[Region]Record{}
	for m := Slot(0); m < 20; m++ {
		for _, me := range s.Regions() {
			if _, changed, _ := plan(t, s, me, m, recs[me], View{Demand: demand, Records: recs}); changed {
				t.Fatalf("slot %d: %s wrote, with every demand within its base", m, me)
			}
		}
	}
}
