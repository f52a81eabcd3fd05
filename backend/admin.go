package backend

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// The values below are what the operator's tools (`sluice limits`,
// `sluice entity`, `sluice buckets`) exchange with a backend's Admin. They
// live here, not in a backend, so that every backend that keeps its state
// in a shared store (DynamoDB, Redis) answers the same commands with the
// same values, and the commands depend on no one backend.

// Config is one stored config record (levels 1 to 4).
type Config struct {
	// Key names the record; its zero value is the system default.
	Key    RecordKey
	Limits []bucket.Limit
	// TTL is when a sync-written entity config expires (ADR-128), in
	// epoch seconds; zero for a config an operator wrote, which never
	// expires.
	TTL int64
}

// Entity is an entity's META: its parent, and whether its requests are
// charged to the parent too (cascade). An empty Parent means no parent
// (Cascade is then false); the zero Entity besides its Name is an entity
// nobody described.
type Entity struct {
	Name    string
	Parent  string
	Cascade bool
}

// Validate reports whether e can be stored: it has a name, is not its
// own parent, and cascades only to a parent it names.
func (e Entity) Validate() error {
	switch {
	case e.Name == "":
		return errors.New("an entity needs a name")
	case e.Parent == e.Name:
		return fmt.Errorf("entity %q cannot be its own parent", e.Name)
	case e.Cascade && e.Parent == "":
		return fmt.Errorf("entity %q: cascade needs a parent", e.Name)
	}
	return nil
}

// ConfigRecords lets Resolve read the records through a store's reader of
// stored configs (an operator's tool, which reads afresh, uncached).
type ConfigRecords func(ctx context.Context, k RecordKey) (Config, bool, error)

func (f ConfigRecords) record(ctx context.Context, k RecordKey) (Record, bool, error) {
	c, ok, err := f(ctx, k)
	return Record{Limits: c.Limits, Synced: c.TTL != 0}, ok, err
}

// Entity implements Records.
func (f ConfigRecords) Entity(ctx context.Context, entity, resource string) (Record, bool, error) {
	return f.record(ctx, EntityKey(entity, resource))
}

// Resource implements Records.
func (f ConfigRecords) Resource(ctx context.Context, resource string) (Record, bool, error) {
	return f.record(ctx, ResourceKey(resource))
}

// System implements Records.
func (f ConfigRecords) System(ctx context.Context) (Record, bool, error) {
	return f.record(ctx, SystemKey())
}

// Bucket is a bucket as stored: the state of each limit at its own refill
// clock. Tokens now need bucket.Refill at the current time.
type Bucket struct {
	// Entity and Resource name the bucket. A store that keeps only an
	// encoded form of a name too long for a key (backend/keyseg hashes
	// one past its MaxLen) shows that encoding where it cannot recover
	// the name.
	Entity, Resource string
	// Cfg is the fingerprint of the limits the bucket was last written
	// with; it differs from bucket.Fingerprint of the resolved limits
	// until the bucket's next write brings it in line.
	Cfg string
	// TTL is when the bucket expires, in epoch seconds; zero: never.
	TTL int64
	// Limits and States go in pairs, in the order of the limits' names.
	// The limits carry their rate and burst; a bucket does not record
	// whether a limit costs hits or one per request (PerRequest is false).
	Limits []bucket.Limit
	States []bucket.State
	// Expired is set by an audit (AllBuckets) for a bucket past its TTL
	// that its store has not deleted yet; decisions treat it as absent.
	// False for every bucket a lookup returns.
	Expired bool
}

// BucketRef is a bucket as a listing shows it: who holds it and the
// fingerprint of its limits, without its state.
type BucketRef struct {
	Entity, Resource string
	// Cfg is the fingerprint of the limits the bucket was last written
	// with (see Bucket.Cfg).
	Cfg string
}

// ErrAppliedChanged is returned by an Admin's SetApplied when another
// `sluice limits apply` wrote the applied set since it was read.
var ErrAppliedChanged = errors.New("another apply changed the stored limits meanwhile")

// Violations lists the invariants of DESIGN section 6 that b breaks, read
// at nowMs (epoch milliseconds) by a reader whose clock may be up to skew
// behind the writers'. Every write enforces them, so any violation is a
// bug or a foreign writer, never a race:
//   - the bucket names its entity, resource and limits fingerprint;
//   - every limit has a positive refill period and no negative amount or
//     burst;
//   - tokens lie within [floor, burst] (below zero only in debt);
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
		case s.Tokens < bucket.Bottom(l, s) || s.Tokens > l.Burst:
			bad("limit %q: %d millitokens, outside [floor %d, burst %d]", l.Name, s.Tokens, bucket.Bottom(l, s), l.Burst)
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
