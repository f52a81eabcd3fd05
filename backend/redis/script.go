package redis

import (
	_ "embed"
	"fmt"
	"strconv"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// decideLua is the script every decision runs (decide.lua says how).
//
//go:embed decide.lua
var decideLua string

// scriptBucket is one bucket of a scripted decision: its key, what to
// charge each of its limits, and how long it may live once written.
type scriptBucket struct {
	key    string
	cfg    string // fingerprint of limits
	limits []bucket.Limit
	costs  []int64 // per limit: the cost, or for a refund what it gives back
	ttlMs  int64   // 0: the bucket never expires
}

// scriptArgs lays out the keys and arguments of one run of decideLua.
func scriptArgs(now int64, refund bool, bs []scriptBucket) (keys, argv []string) {
	mode := "decide"
	if refund {
		mode = "refund"
	}
	argv = []string{strconv.FormatInt(now, 10), mode}
	for _, b := range bs {
		keys = append(keys, b.key)
		argv = append(argv, strconv.FormatInt(b.ttlMs, 10), b.cfg, strconv.Itoa(len(b.limits)))
		for i, l := range b.limits {
			argv = append(argv, l.Name, strconv.FormatInt(l.Amount, 10), strconv.FormatInt(l.Period, 10),
				strconv.FormatInt(l.Burst, 10), strconv.FormatInt(b.costs[i], 10))
		}
	}
	return keys, argv
}

// parseReply reads decideLua's reply: whether the decision was allowed,
// and every limit's state after it, bucket by bucket.
func parseReply(bs []scriptBucket, reply []string) (bool, [][]bucket.State, error) {
	n := 1
	for _, b := range bs {
		n += 3 * len(b.limits)
	}
	if len(reply) != n {
		return false, nil, fmt.Errorf("redis: decision script answered %d values, want %d", len(reply), n)
	}
	states := make([][]bucket.State, len(bs))
	at := 1
	for i, b := range bs {
		states[i] = make([]bucket.State, len(b.limits))
		for j := range b.limits {
			var v [3]int64
			for k := range v {
				x, err := strconv.ParseInt(reply[at], 10, 64)
				if err != nil {
					return false, nil, fmt.Errorf("redis: decision script answered %q: %w", reply[at], err)
				}
				v[k] = x
				at++
			}
			states[i][j] = bucket.State{Tokens: v[0], Clock: v[1], Consumed: v[2]}
		}
	}
	return reply[0] == "1", states, nil
}
