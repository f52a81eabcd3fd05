package dynamodb

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// AllBuckets calls fn for every bucket item of the deployment, read with
// strong consistency by a full scan of the table (an audit, not a path
// for traffic). Items past their ttl that DynamoDB has not yet deleted are
// included, with Expired set: they must keep the invariants too.
func (a *Admin) AllBuckets(ctx context.Context, fn func(Bucket) error) error {
	now := a.now()
	err := a.scanSK(ctx, bucketSKMarker, func(av map[string]types.AttributeValue) error {
		it, err := decodeBucket(av)
		if err != nil {
			return fmt.Errorf("bucket %s %s: %w", attrS(av, attrPK), attrS(av, attrSK), err)
		}
		return fn(Bucket{
			Entity: attrS(av, attrEntity), Resource: attrS(av, attrResource),
			Cfg: it.cfg, TTL: it.ttl, Limits: it.limits, States: it.states, Expired: it.expired(now),
		})
	})
	if err != nil {
		return fmt.Errorf("scanning for buckets: %w", err)
	}
	return nil
}

// Violations lists the invariants of DESIGN section 6 that b breaks, read
// at nowMs (epoch milliseconds) by a reader whose clock may be up to skew
// behind the writers'. Every write's condition enforces them, so any
// violation is a bug or a foreign writer, never a race:
//   - the item names its entity, resource and limits fingerprint;
//   - every limit has a positive refill period and no negative amount or
//     burst;
//   - tokens lie within [0, burst];
//   - the refill clock is set and not in the future;
//   - the consumed total is not negative.
func (b Bucket) Violations(nowMs int64, skew time.Duration) []string {
	var out []string
	bad := func(format string, args ...any) {
		out = append(out, fmt.Sprintf("bucket %q/%q: ", b.Entity, b.Resource)+fmt.Sprintf(format, args...))
	}
	if b.Entity == "" || b.Resource == "" {
		bad("entity or resource attribute missing")
	}
	if b.Cfg == "" {
		bad("no cfg fingerprint")
	}
	if len(b.Limits) == 0 {
		bad("no limits")
	}
	for i, l := range b.Limits {
		s := b.States[i]
		switch {
		case l.Period <= 0 || l.Amount < 0 || l.Burst < 0:
			bad("limit %q: rate %d per %d ms, burst %d", l.Name, l.Amount, l.Period, l.Burst)
		case s.Tokens < 0 || s.Tokens > l.Burst:
			bad("limit %q: %d millitokens, outside [0, burst %d]", l.Name, s.Tokens, l.Burst)
		}
		switch {
		case s.Clock <= 0:
			bad("limit %q: refill clock %d", l.Name, s.Clock)
		case s.Clock > nowMs+skew.Milliseconds():
			bad("limit %q: refill clock %d is %d ms in the future", l.Name, s.Clock, s.Clock-nowMs)
		}
		if s.Consumed < 0 {
			bad("limit %q: consumed total %d", l.Name, s.Consumed)
		}
	}
	return out
}
