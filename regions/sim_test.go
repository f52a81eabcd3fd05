package regions

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The simulation runs the regions of one global limit over many windows:
// each region's sync plans on what it managed to read and writes its
// record some time later; each region's replicas enforce whatever copy
// of the record they may still hold, on clocks off by up to the skew. It
// hunts the invariants the package promises, under faults no test of
// examples would think of: reads that fail one way and not the other,
// syncs that stop and start, regions cut off, writes that land late in
// their budget, clocks at both ends of the skew.

const (
	simWindow = 10_000 // ms
	simSkew   = 1_000  // ms
	simHold   = 2_000  // ms
	// simBudget is how long after planning a sync's write may land: Plan
	// is given the time the write lands at the latest.
	simBudget = 500
	simSlots  = 80
	simStep   = 125 // ms between the instants the invariants are checked at
)

// version is a record as it was written, and the true time it landed.
type version struct {
	at  int64
	rec Record
}

// simRegion is one region: its table's record over time, its sync's
// clock, and its replicas' clocks (offsets from the true time, in ms).
type simRegion struct {
	name     Region
	versions []version
	syncOff  int64
	replicas []int64
}

// current is the record at true time t. Versions land in the order they
// were written (a plan waits for the write before it: runSync), so they
// are sorted by at.
func (r *simRegion) current(t int64) Record {
	i := sort.Search(len(r.versions), func(i int) bool { return r.versions[i].at > t })
	if i == 0 {
		return Record{}
	}
	return r.versions[i-1].rec
}

// held are the records a replica may still hold at true time t: the one
// current when its copy was read, at most CacheFor before.
func (r *simRegion) held(c Clock, t int64) []Record {
	recs := []Record{r.current(t - c.CacheFor())}
	i := sort.Search(len(r.versions), func(i int) bool { return r.versions[i].at > t-c.CacheFor() })
	for ; i < len(r.versions) && r.versions[i].at <= t; i++ {
		recs = append(recs, r.versions[i].rec)
	}
	return recs
}

// enforced is the most any replica of r enforces at true time t.
func (r *simRegion) enforced(s Split, c Clock, t int64) int64 {
	var most int64
	for _, off := range r.replicas {
		for _, rec := range r.held(c, t) {
			most = max(most, rec.InForce(s, r.name, c, t+off))
		}
	}
	return most
}

// faults is what goes wrong in one run.
type faults struct {
	readFail  float64 // chance that one region's read of another's record or demand fails
	syncDown  float64 // chance that a region's sync is down for a window
	cutOff    [2]int  // slots [from, to) in which region 0 can neither read nor be read
	oneWay    [2]int  // slots in which region 1 cannot read region 2, but 2 reads 1
	lateWrite bool    // writes land anywhere within their budget, not at once
}

type simulation struct {
	t *testing.T
	// enforced[i] is what region i enforced at each simStep so far.
	enforced [][]int64
	rng      *rand.Rand
	clock    Clock
	split    Split
	regions  []*simRegion
	demand   func(r int, m Slot) int64
	faults   faults
}

func newSimulation(t *testing.T, seed uint64, weights []int64, demand func(r int, m Slot) int64, f faults) *simulation {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	w := map[Region]int64{}
	sim := &simulation{t: t, rng: rng, clock: Clock{Window: simWindow, Skew: simSkew, Hold: simHold}, demand: demand, faults: f}
	for i, x := range weights {
		name := Region(fmt.Sprintf("r%d", i))
		w[name] = x
		reg := &simRegion{name: name, syncOff: rng.Int64N(2*simSkew+1) - simSkew}
		for range 2 {
			reg.replicas = append(reg.replicas, rng.Int64N(2*simSkew+1)-simSkew)
		}
		// Clocks at the ends of the skew are the interesting ones.
		if rng.IntN(2) == 0 {
			reg.replicas[0] = simSkew * int64(1-2*rng.IntN(2))
		}
		if rng.IntN(2) == 0 {
			reg.syncOff = simSkew * int64(1-2*rng.IntN(2))
		}
		sim.regions = append(sim.regions, reg)
	}
	var err error
	if sim.split, err = NewSplit(w); err != nil {
		t.Fatal(err)
	}
	return sim
}

// readable reports whether region i's sync can read region j's table in
// slot m.
func (sim *simulation) readable(i, j int, m Slot) bool {
	if i == j {
		return true
	}
	f := sim.faults
	in := func(w [2]int) bool { return int(m) >= w[0] && int(m) < w[1] }
	if in(f.cutOff) && (i == 0 || j == 0) {
		return false
	}
	if in(f.oneWay) && i == 1 && j == 2 {
		return false
	}
	return sim.rng.Float64() >= f.readFail
}

// runSync is one step of region i's sync, at true time t. A region's
// record is written on the condition that it is still the one the plan
// read: a plan made while another's write is still on its way loses that
// race, and is dropped (the next plan reads the new record).
func (sim *simulation) runSync(i int, t int64) {
	reg := sim.regions[i]
	if n := len(reg.versions); n > 0 && reg.versions[n-1].at > t {
		return
	}
	now := t + reg.syncOff
	m := sim.clock.At(now)
	v := View{Demand: map[Region]int64{}, Records: map[Region]Record{}}
	for j, other := range sim.regions {
		if !sim.readable(i, j, m) {
			continue
		}
		v.Demand[other.name] = sim.demand(j, m-1)
		if j != i {
			v.Records[other.name] = other.current(t)
		}
	}
	landAt := t
	if sim.faults.lateWrite {
		landAt += []int64{sim.rng.Int64N(simBudget + 1), simBudget}[sim.rng.IntN(2)]
	}
	next, changed, refused := Plan(sim.split, sim.clock, reg.name, now+simBudget, reg.current(t), v)
	if len(refused) > 0 {
		sim.t.Errorf("%s refused loans no fault could make: %v", reg.name, refused)
	}
	if changed {
		reg.versions = append(reg.versions, version{at: landAt, rec: next})
	}
}

// run runs the syncs for simSlots windows, three times a window each (a
// plan early in the window, before the loans' deadline, one any time
// after, and one any time at all, as a second sync of the region would),
// and checks the invariants at every simStep.
func (sim *simulation) run() {
	type event struct {
		at     int64
		region int
	}
	var events []event
	for m := range Slot(simSlots) {
		for i, reg := range sim.regions {
			if sim.rng.Float64() < sim.faults.syncDown {
				continue
			}
			start := sim.clock.Start(m) - reg.syncOff // true time its clock reads the slot's start
			// The early plan lands by the loans' deadline at the
			// latest, and often as late as it may.
			early := []int64{sim.rng.Int64N(simWindow/4 - simBudget), simWindow/4 - simBudget}[sim.rng.IntN(2)]
			events = append(events,
				event{start + early, i},
				event{start + simWindow/4 + sim.rng.Int64N(simWindow*3/4), i},
				event{start + sim.rng.Int64N(simWindow), i})
		}
	}
	slices.SortFunc(events, func(a, b event) int { return int(a.at - b.at) })
	next := 0
	for t := int64(0); t < simSlots*simWindow; t += simStep {
		for next < len(events) && events[next].at <= t {
			sim.runSync(events[next].region, events[next].at)
			next++
		}
		sim.check(t)
	}
}

// check asserts the bound at true time t: what the regions enforce sums
// to at most Total, and so does the most each enforced over the last
// Hold (tokens taken then may still be spent); no region's own record
// takes its share below zero.
func (sim *simulation) check(t int64) {
	var now, lately int64
	if sim.enforced == nil {
		sim.enforced = make([][]int64, len(sim.regions))
	}
	for i, reg := range sim.regions {
		e := reg.enforced(sim.split, sim.clock, t)
		sim.enforced[i] = append(sim.enforced[i], e)
		now += e
		past := sim.enforced[i]
		lately += slices.Max(past[max(0, len(past)-1-simHold/simStep):])
		rec := reg.current(t)
		for m := sim.clock.At(t) - 1; m <= sim.clock.At(t)+Lead+Horizon; m++ {
			if sh := rec.Share(sim.split, reg.name, m); sh < 0 {
				sim.t.Fatalf("t=%d: %s's record gives it %d parts in slot %d", t, reg.name, sh, m)
			}
		}
	}
	if now > Total {
		sim.t.Fatalf("t=%d (slot %d): the regions enforce %d parts together, over %d\n%s", t, sim.clock.At(t), now, Total, sim.dump(t))
	}
	if lately > Total {
		sim.t.Fatalf("t=%d (slot %d): the most each region enforced over the last Hold sums to %d parts, over %d\n%s", t, sim.clock.At(t), lately, Total, sim.dump(t))
	}
}

// dump describes every region at true time t, for a failure's message.
func (sim *simulation) dump(t int64) string {
	var b strings.Builder
	for i, reg := range sim.regions {
		fmt.Fprintf(&b, "%s: base %d, enforces %d, sync clock %+d ms, replicas %v\n", reg.name, sim.split.Base(reg.name), sim.enforced[i][len(sim.enforced[i])-1], reg.syncOff, reg.replicas)
		for _, v := range reg.versions {
			if v.at > t-3*simWindow && v.at <= t {
				fmt.Fprintf(&b, "  written at %d (slot %d): out %v in %v\n", v.at, sim.clock.At(v.at), v.rec.Out, v.rec.In)
			}
		}
	}
	return b.String()
}

// TestSimulationKeepsTheBound runs many random worlds, each with faults,
// and checks the bound at every instant of each.
func TestSimulationKeepsTheBound(t *testing.T) {
	runs := 60
	if testing.Short() {
		runs = 10
	}
	for seed := range uint64(runs) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			n := 2 + rng.IntN(3)
			weights := make([]int64, n)
			for i := range weights {
				weights[i] = 1 + rng.Int64N(5)
			}
			// Demand wanders around the limit and jumps between
			// regions now and then.
			level := make([][]int64, n)
			for i := range level {
				level[i] = make([]int64, simSlots)
				d := rng.Int64N(Total)
				for m := range level[i] {
					if rng.IntN(3) == 0 {
						d = rng.Int64N(Total)
					}
					level[i][m] = max(0, d+rng.Int64N(Total/10)-Total/20)
				}
			}
			demand := func(r int, m Slot) int64 {
				if m < 0 || int(m) >= simSlots {
					return 0
				}
				return level[r][m]
			}
			f := faults{
				readFail:  []float64{0, 0.05, 0.3}[rng.IntN(3)],
				syncDown:  []float64{0, 0.05, 0.2}[rng.IntN(3)],
				lateWrite: rng.IntN(2) == 0,
			}
			if rng.IntN(2) == 0 {
				from := rng.IntN(simSlots / 2)
				f.cutOff = [2]int{from, from + 6 + rng.IntN(10)}
			}
			if n > 2 && rng.IntN(2) == 0 {
				from := rng.IntN(simSlots / 2)
				f.oneWay = [2]int{from, from + 6 + rng.IntN(10)}
			}
			newSimulation(t, seed, weights, demand, f).run()
		})
	}
}

// TestSimulationFollowsDemand runs three regions of equal weight with no
// faults, asked half again the limit together, 80/15/5 and then, from
// slot 20, 5/15/80: the shares follow, the limit is used, and the
// region that turns heavy holds its part within three windows of the
// shift.
func TestSimulationFollowsDemand(t *testing.T) {
	split := []int64{80, 15, 5}
	demand := func(r int, m Slot) int64 {
		share := split[r]
		if m >= 20 {
			share = split[2-r]
		}
		return Total * 3 / 2 * share / 100
	}
	sim := newSimulation(t, 1, []int64{1, 1, 1}, demand, faults{lateWrite: true})
	sim.run()
	// What region r enforced over slot m, on average by the true time:
	// the rate its replicas let through, had they the demand.
	mean := func(r int, m Slot) int64 {
		per := simWindow / simStep
		var sum int64
		for _, v := range sim.enforced[r][int(m)*per : int(m+1)*per] {
			sum += v
		}
		return sum / int64(per)
	}
	for m := Slot(4); m < simSlots; m++ {
		if m >= 20 && m < 23 {
			continue // the shift's three windows
		}
		heavy := 0
		if m >= 20 {
			heavy = 2
		}
		var sum int64
		for r := range 3 {
			sum += mean(r, m)
		}
		// Proportional to demand, the heavy region's part is 80%.
		if got, want := mean(heavy, m), int64(Total*8/10*8/10); got < want {
			t.Errorf("slot %d: the heavy region r%d holds %d parts, want >= %d (0.8 of its part)", m, heavy, got, want)
		}
		if sum < Total*9/10 {
			t.Errorf("slot %d: the regions hold %d parts together, want >= %d", m, sum, Total*9/10)
		}
	}
	for m := Slot(0); m < 30; m++ {
		t.Logf("slot %2d: %7d %7d %7d", m, mean(0, m), mean(1, m), mean(2, m))
	}
}
