package bucket

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// spanWorld simulates the lease protocol of outstanding.go on one limit:
// a store (one State, changed atomically by each write that lands) and
// replicas that lease from it, spend from memory, and report with their
// next write. Writes take a while to land (a far store), some land after
// their writer gave them up (an answer lost: the writer drops its lease),
// replicas crash with leases out, clocks are skewed, the key goes idle
// long enough to refill, and the limit changes. Every admission is
// recorded at the true time it happens, so the bound can be checked over
// every span, not only from the first call.
type spanWorld struct {
	r      *rand.Rand
	l      Limit
	w      int64 // lease window (ms)
	life   int64 // how long a lease lasts after its grant (ms)
	skew   int64 // largest clock offset of a replica (ms)
	now    int64 // true time
	store  State
	reps   []*simReplica
	flight []simWrite
	admits []admission
	// mutants: noOut lends without counting the lease against the burst;
	// late lets a holder spend its lease past its expiry.
	noOut, late bool
	hotUntil    int64
}

type admission struct{ at, tokens int64 }

type simReplica struct {
	offset  int64 // its clock less the true time
	held    int64 // unspent lease tokens
	out     int64 // what the store counts out for it, in window win
	win     int64
	expires int64 // by its own clock
	first   int64 // when it first spent since its last report, by its clock
	busy    bool  // a write of it is in flight
	dead    bool
	// pausedUntil: it asks nothing until then (true time).
	pausedUntil int64
}

type simWrite struct {
	rep     *simReplica
	landsAt int64
	answer  int64 // when the answer comes back
	lost    bool  // the answer never comes
	// What the writer planned at its clock: report on (win, out) with
	// keep tokens kept, and a grant of ask plus cost.
	at        int64
	win, out  int64
	keep, ask int64
	first     int64
	back      int64 // unspent tokens of an expired lease, given back
	cost      int64
	granted   int64
	newWin    int64
	landed    bool
}

func (s *spanWorld) clock(r *simReplica) int64 { return s.now + r.offset }

func (s *spanWorld) admit(n int64) {
	if n > 0 {
		s.admits = append(s.admits, admission{at: s.now, tokens: n})
	}
}

// land applies a write to the store, as a conditional write or a script
// would, at the writer's clock.
func (s *spanWorld) land(w *simWrite) {
	at := w.at
	// Refill before freeing anything: the room a freed window makes is
	// refilled from now, never from the clock's past. The writer's own
	// report goes first: what its lease held when it expired is unspent.
	st := Refill(s.l, s.store, at)
	if w.out > 0 {
		rep := Report{Window: w.win, Out: w.out, Back: w.back, Keep: w.keep, First: w.first}
		if next, ok := Return(s.l, st, rep, at); ok {
			st = next
		} else {
			w.keep = 0 // the window was freed: what it kept is lost
		}
	}
	st, _ = Expire(st, s.w, at)
	denied := st.Tokens < w.cost
	if denied {
		w.cost = 0
	}
	g := min(w.ask, st.Tokens-w.cost)
	if denied {
		g = 0
	}
	if w.cost > 0 {
		st.Tokens -= w.cost
		st.AtRoomSince = 0
	}
	w.newWin = LeaseWindow(w.at+s.life, s.w)
	keep := w.keep
	if s.noOut {
		st.Tokens -= g
	} else if next, ok := Lend(st, w.newWin, g, keep); ok {
		st = next
	} else {
		panic(fmt.Sprintf("no slot free for window %d in %+v at %d", w.newWin, st.Out, w.at))
	}
	w.granted, w.keep = g, keep
	w.landed = true
	s.store = st
	// The store decides the call when the write lands: a call Envoy is
	// told of later was admitted then (and one whose answer is lost, too).
	s.admit(w.cost / Milli)
}

// answered settles a write's answer at its replica.
func (s *spanWorld) answered(w *simWrite) {
	r := w.rep
	r.busy = false
	if r.dead {
		return
	}
	if w.lost {
		// Unknown outcome: the lease is given up (its tokens stay out in
		// the store until their window is freed).
		r.held, r.out, r.win = 0, 0, 0
		return
	}
	r.held = min(r.held, w.keep) + w.granted
	r.out, r.win = w.keep+w.granted, w.newWin
	if s.noOut {
		r.out = 0
	}
	if r.out == 0 {
		r.win = 0
	}
	r.expires = min(w.at+s.life, w.newWin*s.w)
}

func (s *spanWorld) step() {
	s.now += 1 + s.r.Int64N(20)
	if s.r.IntN(400) == 0 {
		// Idle: the bucket refills while leases are out, and then a
		// storm, which spends them on top of it if they do not count.
		s.now += s.r.Int64N(4 * s.life)
		s.hotUntil = s.now + 1000
	}
	for i := 0; i < len(s.flight); i++ {
		w := &s.flight[i]
		if !w.landed && s.now >= w.landsAt {
			s.land(w)
		}
		if w.landed && s.now >= w.answer {
			s.answered(w)
			s.flight = append(s.flight[:i], s.flight[i+1:]...)
			i--
		}
	}
	for _, r := range s.reps {
		if r.dead {
			if s.r.IntN(3000) == 0 {
				*r = simReplica{offset: s.r.Int64N(2*s.skew+1) - s.skew}
			}
			continue
		}
		if s.r.IntN(5000) == 0 {
			r.dead = true // crash: its lease stays out in the store
			continue
		}
		if s.now > s.hotUntil && s.r.IntN(3) != 0 {
			continue
		}
		hits := int64(1 + s.r.IntN(3))
		cost := hits * Milli
		if s.now < r.pausedUntil {
			continue
		}
		if s.r.IntN(500) == 0 {
			// A quiet spell: its lease outlives its window unspent.
			r.pausedUntil = s.now + s.r.Int64N(4*s.life)
			continue
		}
		if s.r.IntN(300) == 0 {
			// A short one: it holds its lease unspent while the bucket
			// stands at its room, then spends it at once.
			r.pausedUntil = s.now + s.r.Int64N(s.life/2)
			continue
		}
		expired := s.clock(r) >= r.expires && !s.late
		if !expired && r.held >= cost {
			r.held -= cost
			if r.first == 0 {
				r.first = s.clock(r)
			}
			s.admit(hits)
			if !r.busy && r.held < r.out/2 {
				s.write(r, 0)
			}
			continue
		}
		if !r.busy {
			s.write(r, cost)
		}
	}
}

// write starts a write of r: a report on its lease, the call's cost (0:
// a renewal) and a grant.
func (s *spanWorld) write(r *simReplica, cost int64) {
	at := s.clock(r)
	keep, back := r.held, int64(0)
	if at >= r.expires && !s.late {
		keep, back = 0, r.held // an expired lease is only given back
		r.held = 0
	}
	rtt := 1 + s.r.Int64N(80)
	w := simWrite{rep: r, at: at, win: r.win, out: r.out, keep: keep, back: back, first: r.first,
		ask: Milli * (1 + s.r.Int64N(s.l.Burst/Milli/3+1)), cost: cost,
		landsAt: s.now + rtt/2, answer: s.now + rtt, lost: s.r.IntN(50) == 0}
	r.busy, r.first = true, 0
	s.flight = append(s.flight, w)
}

// worst is the most the admissions exceed B + R*T + 1 over any span, in
// millitokens (at most zero when the bound holds), and where. Clocks
// skewed by up to s.skew either way stretch a span by twice that: a
// writer ahead credits refill early, once.
func (s *spanWorld) worst() (int64, string) {
	var worst int64 = -1 << 62
	where := ""
	for i := range s.admits {
		var sum int64
		for j := i; j < len(s.admits); j++ {
			sum += s.admits[j].tokens * Milli
			t := s.admits[j].at - s.admits[i].at
			allowed := s.l.Burst + mulDivSat(s.l.Amount, t+2*s.skew, s.l.Period) + Milli
			if d := sum - allowed; d > worst {
				worst, where = d, fmt.Sprintf("%d tokens from %d ms to %d ms", sum/Milli, s.admits[i].at, s.admits[j].at)
			}
		}
	}
	return worst, where
}

func runSpanWorld(seed uint64, skew int64, changes bool, mutate func(*spanWorld)) *spanWorld {
	r := rand.New(rand.NewPCG(seed, 7))
	l := Limit{Name: "rps", Amount: (20 + r.Int64N(100)) * Milli, Period: Second}
	l.Burst = l.Amount * (1 + r.Int64N(3))
	s := &spanWorld{r: r, l: l, life: 2000, skew: skew, now: 1_000_000}
	s.w = LeaseWindowMs(s.life / 2)
	s.store = Full(l, s.now)
	for range 2 + r.IntN(4) {
		s.reps = append(s.reps, &simReplica{offset: r.Int64N(2*s.skew+1) - s.skew})
	}
	if mutate != nil {
		mutate(s)
	}
	for range 3000 {
		s.step()
		if changes && s.r.IntN(300) == 0 {
			// The operator changes the limit: kept leases stay out.
			nl := l
			nl.Burst = max(l.Amount/2, l.Burst+Milli*(s.r.Int64N(40)-20))
			s.store = Reconcile([]Limit{s.l}, []State{s.store}, []Limit{nl}, s.now)[0]
			s.l = nl
		}
		if s.store.Tokens > Room(s.l, s.store) && !s.noOut {
			panic(fmt.Sprintf("store holds %d with %d out, burst %d", s.store.Tokens, s.store.Leased(), s.l.Burst))
		}
	}
	return s
}

// Whatever the replicas do (lease, spend, renew, crash, lose answers,
// skew their clocks by up to a second, go idle until the bucket refills),
// what the fleet admits over any span of time is at most B + R*T + 1:
// the leases out count against the burst. (A limit change is a new
// bucket: spans are checked within the run of one limit.)
func TestLeaseSpanBoundSimulated(t *testing.T) {
	for _, skew := range []int64{0, 1000} {
		for seed := range uint64(40) {
			s := runSpanWorld(seed, skew, false, nil)
			if len(s.admits) < 200 {
				t.Fatalf("seed %d: only %d admissions: the simulation admits too little to test", seed, len(s.admits))
			}
			if d, where := s.worst(); d > 0 {
				t.Errorf("seed %d, clocks %d ms apart: %s: %d millitokens past B + R*T + 1", seed, skew, where, d)
			}
		}
	}
}

// Limits raised and lowered while leases are out: the bucket and its
// leases never hold more than the burst in force, or than the leases
// alone where those were taken under a larger one (runSpanWorld panics
// otherwise).
func TestLeasesWithinBurstAcrossLimitChanges(t *testing.T) {
	for seed := range uint64(40) {
		runSpanWorld(seed, 1000, true, nil)
	}
}

// The mutants the span bound must catch: leases that do not count against
// the burst, and holders that spend past their lease's expiry.
func TestLeaseSpanBoundCatchesMutants(t *testing.T) {
	for name, mutate := range map[string]func(*spanWorld){
		"leases not counted": func(s *spanWorld) { s.noOut = true },
		"spent past expiry":  func(s *spanWorld) { s.late = true },
	} {
		caught := 0
		for seed := range uint64(40) {
			if d, _ := runSpanWorld(seed, 0, false, mutate).worst(); d > 0 {
				caught++
			}
		}
		t.Logf("%s: caught in %d of 40 runs", name, caught)
		if caught == 0 {
			t.Errorf("%s: the span bound held in every run", name)
		}
	}
}

// A lease's tokens come back to the bucket's room when its window has
// ended and the margin has passed, and never before: at most a window and
// the margin after the lease's own expiry. A report that lands after that
// gives nothing back.
func TestExpiredLeasesComeBack(t *testing.T) {
	l := Limit{Name: "rps", Amount: 10 * Milli, Period: Second, Burst: 100 * Milli}
	const horizon = 30_000
	w := LeaseWindowMs(horizon)
	for _, granted := range []int64{1_000_000, 1_000_001, 1_029_999, 1_030_000} {
		expires := granted + 2*horizon
		n := LeaseWindow(expires, w)
		if end := n * w; end < expires || end >= expires+w {
			t.Fatalf("lease expiring at %d kept in window %d, which ends at %d", expires, n, end)
		}
		s, ok := Lend(Full(l, granted), n, 40*Milli, 0)
		if !ok || s.Tokens != 60*Milli || Room(l, s) != 60*Milli {
			t.Fatalf("lent 40 of a full 100: ok %v, tokens %d, room %d", ok, s.Tokens, Room(l, s))
		}
		if _, freed := Expire(s, w, n*w+ExpiryMargin); freed != 0 {
			t.Errorf("granted at %d: freed %d at the margin's end, before it passed", granted, freed)
		}
		if _, freed := Expire(s, w, expires); freed != 0 {
			t.Errorf("granted at %d: freed %d at the lease's own expiry", granted, freed)
		}
		late := n*w + ExpiryMargin + 1
		if late > expires+w+ExpiryMargin {
			t.Errorf("granted at %d: freed only at %d, more than a window and the margin after %d", granted, late, expires)
		}
		after, freed := Expire(s, w, late)
		if freed != 40*Milli || Room(l, after) != l.Burst || after.Tokens != 60*Milli {
			t.Errorf("granted at %d: freed %d, room %d, tokens %d; want 40000, the burst, 60000 (the tokens stay spent)", granted, freed, Room(l, after), after.Tokens)
		}
		if _, ok := Return(l, after, Report{Window: n, Out: 40 * Milli, Back: 40 * Milli}, late); ok {
			t.Errorf("granted at %d: a report landing after its window was freed gave tokens back", granted)
		}
		back, ok := Return(l, s, Report{Window: n, Out: 40 * Milli, Back: 15 * Milli}, granted)
		if !ok || back.Tokens != 75*Milli || back.Leased() != 0 {
			t.Errorf("report of 15 unspent of 40: ok %v, tokens %d, out %d; want 75000, 0", ok, back.Tokens, back.Leased())
		}
	}
}

// Refill stops at the burst less what is out, and a full bucket's clock
// moves on, so that room made later by a report is refilled from then.
func TestRefillStopsAtRoom(t *testing.T) {
	l := Limit{Name: "rps", Amount: 10 * Milli, Period: Second, Burst: 100 * Milli}
	s, _ := Lend(Full(l, 0), 1, 30*Milli, 0)
	s.Tokens = 0
	s = Refill(l, s, 60_000)
	if s.Tokens != 70*Milli || s.Clock != 60_000 {
		t.Fatalf("after a minute: tokens %d, clock %d; want 70000 at 60000", s.Tokens, s.Clock)
	}
	s, _ = Return(l, s, Report{Window: 1, Out: 30 * Milli}, 60_000)
	if s = Refill(l, s, 60_000); s.Tokens != 70*Milli {
		t.Fatalf("a report made room: tokens %d at once; want 70000 (the room refills from now)", s.Tokens)
	}
	if s = Refill(l, s, 61_000); s.Tokens != 80*Milli {
		t.Fatalf("a second later: tokens %d; want 80000", s.Tokens)
	}
}

// Tokens spent from a lease count out until their holder reports them,
// and refill stands still at the room they leave meanwhile; the report
// is credited that refill, from when the holder first spent and the
// bucket stood at its room, up to what it spent, and never the same time
// twice.
func TestReportCreditsTheRefillSpentTokensHeldUp(t *testing.T) {
	l := Limit{Name: "rps", Amount: 10 * Milli, Period: Second, Burst: 100 * Milli}
	lent := func() State {
		// Two holders of 30 each; the bucket stands at its room of 40.
		s, _ := Lend(Full(l, 0), 1, 30*Milli, 0)
		s, _ = Lend(s, 1, 30*Milli, 0)
		return Refill(l, s, 100)
	}
	for _, c := range []struct {
		name  string
		first int64
		spent int64
		at    int64
		want  int64 // tokens after the report
	}{
		// Spent from 100 ms, reported at 2100: 2 s of refill owed, 20
		// tokens, and 20 were spent.
		{"spent early", 100, 20, 2100, 60},
		// The same 20 spent from 1600: half a second owed, 5 tokens.
		{"spent late", 1600, 20, 2100, 45},
		// 3 spent over 2 s: owed 20, but only 3 made room.
		{"spent little", 100, 3, 2100, 43},
		// Nothing spent: nothing owed.
		{"spent nothing", 0, 0, 2100, 40},
	} {
		s := lent()
		s = Refill(l, s, c.at)
		s, ok := Return(l, s, Report{Window: 1, Out: 30 * Milli, Keep: 30*Milli - c.spent*Milli, First: c.first}, c.at)
		if !ok || s.Tokens != c.want*Milli {
			t.Errorf("%s: ok %v, tokens %d; want %d", c.name, ok, s.Tokens, c.want*Milli)
		}
		if s.Tokens > Room(l, s)-(30*Milli-c.spent*Milli) {
			t.Errorf("%s: tokens %d above the room once the holder's keep is lent again", c.name, s.Tokens)
		}
	}

	// Both holders spent 20 from 100 ms; the time owed (2 s, 20 tokens)
	// is credited once between them.
	s := Refill(l, lent(), 2100)
	s, _ = Return(l, s, Report{Window: 1, Out: 30 * Milli, Keep: 10 * Milli, First: 100}, 2100)
	s, _ = Lend(s, 1, 0, 10*Milli)
	s, _ = Return(l, s, Report{Window: 1, Out: 30 * Milli, Keep: 10 * Milli, First: 100}, 2100)
	if s.Tokens != 60*Milli {
		t.Errorf("two reports of the same 2 s: tokens %d; want 60000", s.Tokens)
	}

	// A bucket that went below its room since (a decision took from it)
	// owes nothing from before: refill ran meanwhile.
	s = lent()
	states, res := []State{s}, make([]Result, 1)
	Decide([]Limit{l}, states, 1, 1000, res)
	s = Refill(l, states[0], 2100)
	if s.Tokens != 40*Milli || s.AtRoomSince != 1100 {
		t.Fatalf("refilled after a decision: tokens %d, at room since %d; want 40000 since 1100", s.Tokens, s.AtRoomSince)
	}
	s, _ = Return(l, s, Report{Window: 1, Out: 30 * Milli, Keep: 10 * Milli, First: 100}, 2100)
	if s.Tokens != 50*Milli {
		t.Errorf("report after the bucket refilled to its room at 1100: tokens %d; want 50000 (1 s owed)", s.Tokens)
	}

	// Room freed by an expired window may not have been spent in: it
	// owes nothing.
	at := int64(1000 + ExpiryMargin + 1)
	s, freed := Expire(Refill(l, lent(), at), 1000, at)
	if s = Refill(l, s, at); freed != 60*Milli || s.Tokens != 40*Milli {
		t.Errorf("windows freed: %d freed, tokens %d; want 60000, 40000", freed, s.Tokens)
	}
}
