package redis

import (
	_ "embed"
	"errors"
	"fmt"
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
// back).
type scriptCall struct {
	refund bool
	costs  []int64
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
// allowed and each limit's state after it (tokens and clock); or err,
// when Redis refused the group's keys and the group changed nothing.
type groupReply struct {
	err     error
	allowed []bool
	after   [][]bucket.State
}

// scriptArgs lays out the keys and arguments of one run of decideLua:
// each distinct set of limits once, then the groups, whose buckets name
// theirs by index.
func scriptArgs(now int64, groups []scriptGroup) (keys, argv []string) {
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
	nkeys, nbody := 0, 1
	for _, g := range groups {
		nkeys += len(g.buckets)
		nbody += 2 + 2*len(g.buckets) + len(g.calls)*(1+g.limits())
	}
	keys = make([]string, 0, nkeys)
	body := make([]string, 0, nbody)
	body = append(body, strconv.Itoa(len(groups)))
	for _, g := range groups {
		body = append(body, strconv.Itoa(len(g.buckets)))
		for _, b := range g.buckets {
			keys = append(keys, b.key)
			body = append(body, strconv.Itoa(1+layoutOf(b)), strconv.FormatInt(b.ttlMs, 10))
		}
		body = append(body, strconv.Itoa(len(g.calls)))
		for _, c := range g.calls {
			mode := "d"
			if c.refund {
				mode = "r"
			}
			body = append(body, mode)
			for _, cost := range c.costs {
				body = append(body, strconv.FormatInt(cost, 10))
			}
		}
	}
	nlayout := 0
	for _, l := range layouts {
		nlayout += 2 + 4*len(l.limits)
	}
	argv = make([]string, 0, 2+nlayout+len(body))
	argv = append(argv, strconv.FormatInt(now, 10), strconv.Itoa(len(layouts)))
	for _, l := range layouts {
		argv = append(argv, l.cfg, strconv.Itoa(len(l.limits)))
		for _, x := range l.limits {
			argv = append(argv, x.Name, strconv.FormatInt(x.Amount, 10), strconv.FormatInt(x.Period, 10),
				strconv.FormatInt(x.Burst, 10))
		}
	}
	return keys, append(argv, body...)
}

// groupOK opens a group's answer in decideLua's reply; anything else in
// its place is Redis's error for the group.
const groupOK = "ok"

// parseReply reads decideLua's reply for a run of groups.
func parseReply(groups []scriptGroup, reply []rueidis.RedisMessage) ([]groupReply, error) {
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
		if status != groupOK {
			out[gi].err = fmt.Errorf("redis: %s", status)
			continue
		}
		nlimits := g.limits()
		if len(reply)-at < len(g.calls)*(1+2*nlimits) {
			return nil, short()
		}
		r := groupReply{allowed: make([]bool, len(g.calls)), after: make([][]bucket.State, len(g.calls))}
		var bad error
		next := func() int64 {
			n, err := reply[at].ToInt64()
			if err != nil && bad == nil {
				bad = fmt.Errorf("redis: decision script answered %v", err)
			}
			at++
			return n
		}
		for c := range g.calls {
			switch next() {
			case 1:
				r.allowed[c] = true
			case 0:
			default:
				bad = errors.Join(bad, errors.New("redis: decision script answered neither 1 nor 0 for allowed"))
			}
			r.after[c] = make([]bucket.State, nlimits)
			for i := range nlimits {
				r.after[c][i] = bucket.State{Tokens: next(), Clock: next()}
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
