package redis

import (
	_ "embed"
	"fmt"
	"strconv"

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

// scriptReply is what a batch did: per call, whether it was allowed and
// each limit's state after it (tokens and clock); and each limit's
// consumed total after the batch.
type scriptReply struct {
	allowed  []bool
	after    [][]bucket.State
	consumed []int64
}

// scriptArgs lays out the keys and arguments of one run of decideLua.
func scriptArgs(now int64, bs []scriptBucket, calls []scriptCall) (keys, argv []string) {
	argv = []string{strconv.FormatInt(now, 10), strconv.Itoa(len(calls))}
	for _, b := range bs {
		keys = append(keys, b.key)
		argv = append(argv, strconv.FormatInt(b.ttlMs, 10), b.cfg, strconv.Itoa(len(b.limits)))
		for _, l := range b.limits {
			argv = append(argv, l.Name, strconv.FormatInt(l.Amount, 10), strconv.FormatInt(l.Period, 10),
				strconv.FormatInt(l.Burst, 10))
		}
	}
	for _, c := range calls {
		mode := "d"
		if c.refund {
			mode = "r"
		}
		argv = append(argv, mode)
		for _, cost := range c.costs {
			argv = append(argv, strconv.FormatInt(cost, 10))
		}
	}
	return keys, argv
}

// parseReply reads decideLua's reply for a batch of ncalls calls over
// nlimits limits in all.
func parseReply(nlimits, ncalls int, reply []string) (scriptReply, error) {
	if want := ncalls*(1+2*nlimits) + nlimits; len(reply) != want {
		return scriptReply{}, fmt.Errorf("redis: decision script answered %d values, want %d", len(reply), want)
	}
	var err error
	at := 0
	next := func() int64 {
		x, perr := strconv.ParseInt(reply[at], 10, 64)
		if perr != nil && err == nil {
			err = fmt.Errorf("redis: decision script answered %q: %w", reply[at], perr)
		}
		at++
		return x
	}
	r := scriptReply{allowed: make([]bool, ncalls), after: make([][]bucket.State, ncalls), consumed: make([]int64, nlimits)}
	for c := range ncalls {
		r.allowed[c] = reply[at] == "1"
		at++
		r.after[c] = make([]bucket.State, nlimits)
		for i := range nlimits {
			r.after[c][i] = bucket.State{Tokens: next(), Clock: next()}
		}
	}
	for i := range nlimits {
		r.consumed[i] = next()
	}
	return r, err
}
