// Package memory is Sluice's embedded backend: token buckets in process
// memory, deciding exactly as the DynamoDB backend does, for a single
// replica or a first run. It is what `sluice serve` uses when no table is
// named.
//
// Buckets live in a fixed number of shards, each a map guarded by its own
// mutex that is held only to find or insert a bucket; a decision then
// locks just its bucket (two, in a fixed order, for a cascade), so there
// is no global lock. Idle buckets expire by the TTL rules of ADR-119 and
// ADR-128, and a sweep every minute drops expired buckets and buckets that
// have refilled to their burst (such a bucket is indistinguishable from
// one never seen). A hard cap on the number of buckets keeps memory
// bounded under a flood of distinct keys: a full shard first drops
// expired and refilled buckets, then the least recently used.
package memory

import (
	"cmp"
	"context"
	"hash/maphash"
	"slices"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// DefaultMaxBuckets bounds the buckets held when Options.MaxBuckets is 0.
// At a few hundred bytes a bucket it is a few hundred MiB at most.
const DefaultMaxBuckets = 1_000_000

const shardCount = 64

// Options configure a Backend. The zero Options is usable: no overrides,
// TTL management off, DefaultMaxBuckets, the wall clock, a sweep a minute.
type Options struct {
	// Overrides are the operator's records (levels 1, 2 and the record
	// side of 3 and 4). Nil means none.
	Overrides *Overrides
	// TTLMultiplier scales a default-sourced bucket's time to fill into
	// its TTL (ADR-119: 7). Zero or less turns TTL management off.
	TTLMultiplier int64
	// MaxBuckets caps the buckets held. Zero means DefaultMaxBuckets.
	MaxBuckets int
	// Global is the part of a limit marked global this replica enforces
	// (its region's); the zero Global enforces it whole.
	Global backend.Global
	// Now returns the time in epoch milliseconds. Nil means the wall clock.
	Now func() int64
	// SweepInterval is how often idle buckets are dropped; 0 means a minute
	// (ADR-001's default), negative disables the background sweep.
	SweepInterval time.Duration
	// OnBucketWrite, when set, hears every bucket write with the TTL it
	// set (0: the bucket never expires), so the TTL distribution can be
	// monitored (ADR-031). It runs under the bucket's lock: keep it quick.
	OnBucketWrite func(ttl time.Duration)
}

// Backend is the in-memory backend. Create it with New and release its
// sweeper with Close. It is safe for concurrent use.
type Backend struct {
	opts   Options
	seed   maphash.Seed
	shards [shardCount]shard
	stop   chan struct{}
	done   chan struct{}
}

// New returns a Backend; its background sweep runs until Close.
func New(opts Options) *Backend {
	if opts.MaxBuckets <= 0 {
		opts.MaxBuckets = DefaultMaxBuckets
	}
	if opts.Now == nil {
		opts.Now = func() int64 { return time.Now().UnixMilli() }
	}
	if opts.SweepInterval == 0 {
		opts.SweepInterval = time.Minute
	}
	b := &Backend{opts: opts, seed: maphash.MakeSeed(), stop: make(chan struct{}), done: make(chan struct{})}
	perShard := max(1, opts.MaxBuckets/shardCount)
	for i := range b.shards {
		b.shards[i].buckets = make(map[key]*entry)
		b.shards[i].max = perShard
	}
	if opts.SweepInterval > 0 {
		go b.sweepLoop(opts.SweepInterval)
	} else {
		close(b.done)
	}
	return b
}

// Close stops the background sweep. Decisions still work afterwards.
func (b *Backend) Close() error {
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	<-b.done
	return nil
}

// Ping reports the backend reachable; memory always is.
func (b *Backend) Ping(context.Context) error { return nil }

// charge is one bucket a request is charged to.
type charge struct {
	key key
	res backend.Resolved
	e   *entry
}

// Decide implements backend.Backend.
func (b *Backend) Decide(ctx context.Context, req *backend.Request) (backend.Decision, error) {
	if err := ctx.Err(); err != nil {
		return backend.Decision{}, err
	}
	var buf [2]charge
	charges := buf[:0]
	level := backend.LevelNone
	for i, entity := range [2]string{req.Entity, req.Parent} {
		if entity == "" || (i == 1 && entity == req.Entity) {
			continue
		}
		res, err := backend.Resolve(ctx, b.opts.Overrides, entity, req.Resource, req.Defaults)
		if err != nil {
			return backend.Decision{}, err
		}
		res = b.opts.Global.Apply(req.Global, res)
		if i == 0 {
			level = res.Level
		}
		if len(res.Limits) > 0 {
			charges = append(charges, charge{key: key{entity, req.Resource}, res: res})
		}
	}
	if len(charges) == 0 {
		return backend.NotLimited(), nil
	}
	now := b.opts.Now()
	// Bucket writes are reported after the buckets are unlocked (defers
	// run last first): callers of a hot bucket wait on its lock, not on
	// the metrics.
	var ttls [2]time.Duration
	written := 0
	if b.opts.OnBucketWrite != nil {
		defer func() {
			for _, ttl := range ttls[:written] {
				b.opts.OnBucketWrite(ttl)
			}
		}()
	}
	b.lock(charges, now)
	defer func() {
		for i := range charges {
			charges[i].e.mu.Unlock()
		}
	}()

	var limits []bucket.Limit
	var states []bucket.State
	for i := range charges {
		c := &charges[i]
		c.e.prepare(c.res.Limits, now)
		if len(charges) == 1 {
			limits, states = c.e.limits, c.e.states
		} else {
			limits = append(limits, c.e.limits...)
			states = append(states, c.e.states...)
		}
	}
	results, allowed := backend.Apply(req, limits, states, now)
	off := 0
	for i := range charges {
		e := charges[i].e
		if len(charges) > 1 {
			copy(e.states, states[off:off+len(e.states)])
			off += len(e.states)
		}
		e.used = now
		// Only a write moves the TTL: a zero-hit check changes nothing, as
		// on DynamoDB, where it writes nothing.
		if (allowed || (req.Charge && !req.Refund)) && (req.Hits > 0 || req.Refund) {
			e.expires = 0
			ttl, ok := backend.BucketTTL(charges[i].res, b.opts.TTLMultiplier)
			if ok {
				e.expires = now + ttl
			}
			ttls[written] = backend.TTLDuration(ttl, ok)
			written++
		}
	}
	return backend.Decision{
		Allowed: allowed,
		Limits:  limits,
		Results: results,
		Binding: bucket.Binding(limits, results),
		Level:   level,
	}, nil
}

// lock finds or creates the entries of charges and locks them in key
// order, so two cascades over the same pair cannot deadlock. An entry
// evicted between lookup and lock is looked up again. charges keeps its
// order (entity first).
func (b *Backend) lock(charges []charge, now int64) {
	order := [2]int{0, 1}
	if len(charges) == 2 && cmp.Or(
		cmp.Compare(charges[1].key.entity, charges[0].key.entity),
		cmp.Compare(charges[1].key.resource, charges[0].key.resource)) < 0 {
		order = [2]int{1, 0}
	}
	for {
		for i := range charges {
			charges[i].e = b.shard(charges[i].key).get(charges[i].key, now)
		}
		dead := false
		for _, i := range order[:len(charges)] {
			charges[i].e.mu.Lock()
			dead = dead || charges[i].e.dead
		}
		if !dead {
			return
		}
		for i := range charges {
			charges[i].e.mu.Unlock()
		}
	}
}

func (b *Backend) shard(k key) *shard {
	var h maphash.Hash
	h.SetSeed(b.seed)
	h.WriteString(k.entity)
	h.WriteByte(0)
	h.WriteString(k.resource)
	return &b.shards[h.Sum64()%shardCount]
}

// Len is the number of buckets held.
func (b *Backend) Len() int {
	n := 0
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		n += len(s.buckets)
		s.mu.Unlock()
	}
	return n
}

// Snapshot is a copy of one bucket's state, for inspection and tests.
type Snapshot struct {
	Limits []bucket.Limit
	States []bucket.State
	// Expires is the epoch millisecond the bucket expires at; 0 is never.
	Expires int64
}

// Snapshot returns the state of the bucket (entity, resource), if held.
func (b *Backend) Snapshot(entity, resource string) (Snapshot, bool) {
	k := key{entity, resource}
	s := b.shard(k)
	s.mu.Lock()
	e, ok := s.buckets[k]
	s.mu.Unlock()
	if !ok {
		return Snapshot{}, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.dead || e.states == nil {
		return Snapshot{}, false
	}
	return Snapshot{Limits: slices.Clone(e.limits), States: slices.Clone(e.states), Expires: e.expires}, true
}

// Sweep drops every bucket that has expired or refilled to its burst. The
// background sweep calls it; tests may call it directly.
func (b *Backend) Sweep() {
	now := b.opts.Now()
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		for k, e := range s.buckets {
			s.dropIfIdle(k, e, now)
		}
		s.mu.Unlock()
	}
}

func (b *Backend) sweepLoop(every time.Duration) {
	defer close(b.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			b.Sweep()
		}
	}
}
