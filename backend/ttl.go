package backend

import (
	"math"
	"time"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// DefaultTTLMultiplier is ADR-119's factor: a default-sourced bucket lives
// seven times as long as its slowest limit takes to fill.
const DefaultTTLMultiplier = 7

// BucketTTL is how long (ms) after a write a bucket may live, by the rules
// of ADR-119 and ADR-128, and false when it must not expire:
//   - limits from an operator-written entity config (no ttl on the config):
//     no TTL, the operator's bucket is kept;
//   - limits from a sync-written entity config, the entity default, the
//     resource default or the system default: the longest time to fill
//     over the limits, times multiplier.
//
// A bucket never expires while its limits could still be in debt: the TTL
// is at least the time to refill from the floor (bucket.TimeToRecover),
// which only a multiplier under 2, or a debt of more than one burst,
// makes longer than the multiplied time to fill. Expiring sooner would
// forgive the debt, since the next call starts the bucket full.
//
// A multiplier <= 0 turns TTL management off (no bucket expires), and a
// limit that never refills to a non-empty burst keeps its bucket, since
// dropping it would hand out the burst again.
func BucketTTL(r Resolved, multiplier int64) (int64, bool) {
	if multiplier <= 0 || (r.Level == LevelEntity && !r.Synced) {
		return 0, false
	}
	longest, deepest := int64(0), int64(0)
	for _, l := range r.Limits {
		fill := bucket.TimeToFill(l)
		if fill == bucket.Never {
			return 0, false
		}
		longest = max(longest, fill)
		deepest = max(deepest, bucket.TimeToRecover(l))
	}
	if longest > math.MaxInt64/multiplier {
		return math.MaxInt64, true
	}
	return max(longest*multiplier, deepest), true
}

// TTLDuration turns BucketTTL's answer into a Duration for reporting: 0
// for a bucket that never expires, and at most about 290 years (the
// longest Duration) for one whose limits take longer to fill.
func TTLDuration(ttlMs int64, ok bool) time.Duration {
	if !ok {
		return 0
	}
	return time.Duration(min(ttlMs, math.MaxInt64/int64(time.Millisecond))) * time.Millisecond
}
