package redis

import (
	_ "embed"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// decideLua is the script every batch of decisions runs (decide.lua says
// how).
//
//go:embed decide.lua
var decideLua string

// scriptBucket is one bucket of a scripted batch: its key, its limits and
// how long it may live once written.
type scriptBucket struct {
	key    string
	cfg    string // fingerprint of limits
	limits []bucket.Limit
	ttlMs  int64 // 0: the bucket never expires
}

// scriptCall is one call of a batch: a decision or a refund, and what it
// costs each limit of every bucket, in order (for a refund, what it gives
// back). A decision of a replica with leases is a lease call: per limit,
// back is what its lease gives back to the bucket first and want the
// grant it asks for after (both nil otherwise).
type scriptCall struct {
	refund bool
	lease  bool
	// charge: the costs are tokens already used, taken whatever the
	// limits hold, down to their floors (bucket.Charge).
	charge bool
	costs  []int64
	back   []int64
	want   []int64
	// A lease call's report, per limit (backend.LeaseReport): what the
	// bucket counts out for the lease, what of it the lease keeps, the
	// window it is out in, and the window of the new lease.
	out, keep   []int64
	win, newWin []int64
}

// scriptGroup is the calls of a run on one set of buckets under one set
// of limits, in the order they are decided.
type scriptGroup struct {
	buckets []scriptBucket
	calls   []scriptCall
}

// limits is how many limits the group's buckets hold in all: the length
// of each call's costs.
func (g scriptGroup) limits() int {
	n := 0
	for _, b := range g.buckets {
		n += len(b.limits)
	}
	return n
}

// groupReply is what a run did to one group: per call, whether it was
// allowed and each limit's state after it (tokens and clock; for a lease
// call, the consumed total too) and, for a lease call, the grant it took
// per limit and what the burst cut off what it gave back; or err, when Redis refused the group's keys and the group
// changed nothing.
type groupReply struct {
	err     error
	allowed []bool
	after   [][]bucket.State
	granted [][]int64
	cut     [][]int64
	kept    [][]int64
	// held, per charge call (nil for the others), whether each limit
	// held its cost.
	held [][]bool
}

// scriptArgs lays out the keys and arguments of one run of decideLua:
// each distinct set of limits once, then the groups, whose buckets name
// theirs by index.
func scriptArgs(now, window int64, groups []scriptGroup) (keys, argv []string) {
	// The layouts, found by a scan: a run holds few distinct ones.
	var layouts []scriptBucket
	layoutOf := func(b scriptBucket) int {
		for i, l := range layouts {
			if l.cfg == b.cfg && slices.Equal(l.limits, b.limits) {
				return i
			}
		}
		layouts = append(layouts, b)
		return len(layouts) - 1
	}
	nkeys, nargs := 0, 4
	for _, g := range groups {
		nkeys += len(g.buckets)
		nargs += 2 + 2*len(g.buckets) + len(g.calls)*(1+7*g.limits())
		for _, b := range g.buckets {
			layoutOf(b)
		}
	}
	for _, l := range layouts {
		nargs += 2 + 8*len(l.limits)
	}
	keys = make([]string, 0, nkeys)
	a := newArgs(nargs)
	a.int(now)
	a.int(window)
	a.int(int64(len(layouts)))
	for _, l := range layouts {
		a.str(l.cfg)
		a.int(int64(len(l.limits)))
		for _, x := range l.limits {
			a.str(x.Name)
			a.int(x.Amount)
			a.int(x.Period)
			a.int(x.Burst)
			a.int(max(x.Debt, bucket.NoDebt))
			// A budget's period bounds, computed here so that the
			// script does no calendar arithmetic: it gives the budget
			// again to a state clocked before the start (twice before
			// the previous period's).
			if x.IsBudget() {
				a.int(bucket.PeriodStart(x, now))
				a.int(bucket.PrevPeriodStart(x, now))
			} else {
				a.int(0)
				a.int(0)
			}
			a.str(x.CalendarKey())
		}
	}
	a.int(int64(len(groups)))
	for _, g := range groups {
		a.int(int64(len(g.buckets)))
		for _, b := range g.buckets {
			keys = append(keys, b.key)
			a.int(int64(1 + layoutOf(b)))
			a.int(b.ttlMs)
		}
		a.int(int64(len(g.calls)))
		for _, c := range g.calls {
			switch {
			case c.refund:
				a.str("r")
			case c.lease && c.charge:
				a.str("m")
			case c.lease:
				a.str("l")
			case c.charge:
				a.str("c")
			default:
				a.str("d")
			}
			for _, cost := range c.costs {
				a.int(cost)
			}
			if c.lease && !c.refund {
				for _, v := range [][]int64{c.back, c.want, c.out, c.keep, c.win, c.newWin} {
					for i := range c.costs {
						a.int(at(v, i))
					}
				}
			}
		}
	}
	return keys, a.done()
}

// at is v[i], or 0 past v's end (nil: nothing).
func at(v []int64, i int) int64 {
	if i < len(v) {
		return v[i]
	}
	return 0
}

// args builds a script's arguments, writing every number into one buffer
// that becomes one string, so that a run costs a few allocations however
// many numbers it carries (a batch carries several per decision).
type args struct {
	list []string
	buf  []byte
	// nums are the numbers' places: in list, and their ends in buf.
	nums []argNum
}

type argNum struct{ at, end int }

func newArgs(n int) *args {
	return &args{list: make([]string, 0, n), buf: make([]byte, 0, 8*n), nums: make([]argNum, 0, n)}
}

func (a *args) str(s string) { a.list = append(a.list, s) }

func (a *args) int(n int64) {
	a.buf = strconv.AppendInt(a.buf, n, 10)
	a.nums = append(a.nums, argNum{at: len(a.list), end: len(a.buf)})
	a.list = append(a.list, "")
}

// done returns the arguments; a is not used again.
func (a *args) done() []string {
	s, start := string(a.buf), 0
	for _, n := range a.nums {
		a.list[n.at] = s[start:n.end]
		start = n.end
	}
	return a.list
}

// groupOK opens a group's answer in decideLua's reply; anything else in
// its place is Redis's error for the group.
const groupOK = "ok"

// parseReply reads decideLua's reply for a run of groups. The answers of
// every call share three allocations: a run answers many calls.
func parseReply(groups []scriptGroup, reply []rueidis.RedisMessage) ([]groupReply, error) {
	ncalls, nstates := 0, 0
	for _, g := range groups {
		ncalls += len(g.calls)
		nstates += len(g.calls) * g.limits()
	}
	allowed, after, states := make([]bool, ncalls), make([][]bucket.State, ncalls), make([]bucket.State, nstates)
	out := make([]groupReply, len(groups))
	at := 0
	short := func() error {
		return fmt.Errorf("redis: decision script answered %d values, fewer than its calls need", len(reply))
	}
	for gi, g := range groups {
		if at >= len(reply) {
			return nil, short()
		}
		status, err := reply[at].ToString()
		if err != nil {
			return nil, fmt.Errorf("redis: decision script answered a group with %v", err)
		}
		at++
		nc, nlimits := len(g.calls), g.limits()
		r := groupReply{allowed: allowed[:nc:nc], after: after[:nc:nc]}
		allowed, after = allowed[nc:], after[nc:]
		if status != groupOK {
			out[gi].err = fmt.Errorf("redis: %s", status)
			continue
		}
		need := nc * (1 + 2*nlimits)
		for _, c := range g.calls {
			if c.lease && !c.refund {
				need += 5 * nlimits
			}
			if c.charge && !c.refund {
				need += nlimits
			}
		}
		if len(reply)-at < need {
			return nil, short()
		}
		var bad error
		next := func() int64 {
			n, err := reply[at].ToInt64()
			if err != nil && bad == nil {
				bad = fmt.Errorf("redis: decision script answered %v", err)
			}
			at++
			return n
		}
		for c := range nc {
			switch next() {
			case 1:
				r.allowed[c] = true
			case 0:
			default:
				bad = errors.Join(bad, errors.New("redis: decision script answered neither 1 nor 0 for allowed"))
			}
			r.after[c], states = states[:nlimits:nlimits], states[nlimits:]
			for i := range nlimits {
				r.after[c][i] = bucket.State{Tokens: next(), Clock: next()}
			}
			if g.calls[c].lease && !g.calls[c].refund {
				if r.granted == nil {
					r.granted, r.cut, r.kept = make([][]int64, nc), make([][]int64, nc), make([][]int64, nc)
				}
				r.granted[c], r.cut[c], r.kept[c] = make([]int64, nlimits), make([]int64, nlimits), make([]int64, nlimits)
				for i := range nlimits {
					r.granted[c][i] = next()
					r.after[c][i].Consumed = next()
					r.cut[c][i] = next()
					r.kept[c][i] = next()
					// What the fleet's leases hold, as one slot that never
					// ends: all a view needs of them is their sum.
					r.after[c][i].Out[0] = bucket.Out{Window: math.MaxInt64, Tokens: next()}
				}
			}
			if g.calls[c].charge && !g.calls[c].refund {
				if r.held == nil {
					r.held = make([][]bool, nc)
				}
				r.held[c] = make([]bool, nlimits)
				for i := range nlimits {
					r.held[c][i] = next() == 1
				}
			}
		}
		if bad != nil {
			return nil, bad
		}
		out[gi] = r
	}
	if at != len(reply) {
		return nil, fmt.Errorf("redis: decision script answered %d values, more than its calls need (%d)", len(reply), at)
	}
	return out, nil
}
