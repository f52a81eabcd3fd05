package rlqs

import "math"

// Strategy is what an assignment tells Envoy's filter to do with a
// bucket. The zero Strategy denies everything (DENY_ALL).
type Strategy struct {
	// Allow, when set, admits everything (ALLOW_ALL): the bucket is not
	// limited, and nothing is taken for it.
	Allow bool
	// PerSecond and MaxTokens describe a token bucket refilled with
	// PerSecond tokens each second (fill_interval 1 s) up to MaxTokens,
	// starting full. Zero PerSecond (and not Allow) is DENY_ALL.
	PerSecond uint64
	MaxTokens uint64
}

// Deny reports whether s denies everything.
func (s Strategy) Deny() bool { return !s.Allow && s.PerSecond == 0 }

// assignment is a strategy as sent to one Envoy for one bucket.
type assignment struct {
	Strategy
	// expires is when (ms, this replica's clock) Envoy stops applying
	// it, at the latest: its TTL from the moment it was sent, plus the
	// delivery allowance.
	expires int64
	// paidUntil is the time (ms) up to which the token bucket's fills
	// have been taken from the shared bucket: fills after it are not
	// paid. It equals expires for a token bucket.
	paidUntil int64
}

// fills is what a token bucket refilled at perSecond admits from fills
// between from and until (ms): rounded up, so a replica never pays less
// than the fills it lets Envoy make.
func fills(perSecond uint64, from, until int64) uint64 {
	if until <= from || perSecond == 0 {
		return 0
	}
	f := math.Ceil(float64(perSecond) * float64(until-from) / 1000)
	if f >= math.MaxUint64/4 {
		return math.MaxUint64 / 4
	}
	return uint64(f)
}

// unpaidFills is what a token bucket refilled at perSecond would have
// made between from and until (ms) had it not been replaced: rounded
// down, so a replica never credits itself a fill Envoy may still make.
func unpaidFills(perSecond uint64, from, until int64) uint64 {
	if until <= from || perSecond == 0 {
		return 0
	}
	return uint64(math.Floor(float64(perSecond) * float64(until-from) / 1000))
}
