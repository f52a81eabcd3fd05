// Package recordcache keeps the operator's config records of recent
// buckets in memory, for the backends that store them remotely (DynamoDB,
// Redis): a bounded LRU whose entries live for a TTL (60 s by default), so
// an operator's change reaches every replica within that time and a warm
// bucket costs no config read at all.
//
// Reads stay off the decision path after warm-up: a lookup that finds an
// entry older than three quarters of the TTL answers from it and starts
// one read in the background to replace it, so a bucket in steady use
// never misses. Concurrent misses for one key share one read, which runs
// on its own deadline rather than the first caller's: a caller with
// Envoy's 20 ms may give up, but the read still lands in the cache for
// the next. A miss (nothing configured) is cached like any answer. No lock
// is held across I/O.
package recordcache

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
	"golang.org/x/sync/singleflight"

	"github.com/sluice-rl/sluice/backend"
)

// Set is what one bucket's resolution reads from the store: the records
// of levels 1 to 4, each with whether it exists, and the entity's cascade
// parent. It stands in for the store in backend.Resolve, for the one
// bucket it was read for. A Set in the cache is never modified.
type Set struct {
	EntityConfig, EntityDefaultConfig, ResourceConfig, SystemConfig             backend.Record
	HasEntityConfig, HasEntityDefaultConfig, HasResourceConfig, HasSystemConfig bool
	// Parent is the entity's parent when its stored metadata asks for
	// cascade; "" otherwise.
	Parent string
}

// Entity implements backend.Records for the Set's bucket.
func (s *Set) Entity(_ context.Context, _, resource string) (backend.Record, bool, error) {
	if resource == backend.DefaultResource {
		return s.EntityDefaultConfig, s.HasEntityDefaultConfig, nil
	}
	return s.EntityConfig, s.HasEntityConfig, nil
}

// Resource implements backend.Records for the Set's bucket.
func (s *Set) Resource(context.Context, string) (backend.Record, bool, error) {
	return s.ResourceConfig, s.HasResourceConfig, nil
}

// System implements backend.Records for the Set's bucket.
func (s *Set) System(context.Context) (backend.Record, bool, error) {
	return s.SystemConfig, s.HasSystemConfig, nil
}

// FetchFunc reads the Set of (entity, resource) from the store. An error
// is for a store that could not answer, never for records that are
// missing: those are cached as missing for the TTL.
type FetchFunc func(ctx context.Context, entity, resource string) (*Set, error)

// Options configure a Cache; Fetch is required, zero values of the rest
// take the defaults named on each field.
type Options struct {
	Fetch FetchFunc
	// Size bounds the buckets whose records are kept (10,000); TTL is how
	// long an entry is used (60 s).
	Size int
	TTL  time.Duration
	// Now is the clock, epoch ms (time.Now).
	Now func() int64
	// Hits and Misses, when set, count the lookups answered from the
	// cache and those that waited for a read.
	Hits, Misses *atomic.Uint64
	// ReadTimeout bounds one shared read, which the callers waiting on it
	// each give up on at their own deadline (5 s).
	ReadTimeout time.Duration
}

// Cache is safe for concurrent use. Close it to end the reads nobody
// waits for.
type Cache struct {
	o            Options
	lru          *expirable.LRU[string, *entry]
	refreshAfter int64 // ms
	flight       singleflight.Group
	base         context.Context
	cancel       context.CancelFunc
}

type entry struct {
	set        *Set
	at         int64       // when it was read (epoch ms)
	refreshing atomic.Bool // a read to replace it has started
}

// New returns an empty Cache.
func New(o Options) *Cache {
	if o.Size <= 0 {
		o.Size = 10_000
	}
	if o.TTL <= 0 {
		o.TTL = time.Minute
	}
	if o.Now == nil {
		o.Now = func() int64 { return time.Now().UnixMilli() }
	}
	if o.Hits == nil {
		o.Hits = new(atomic.Uint64)
	}
	if o.Misses == nil {
		o.Misses = new(atomic.Uint64)
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = 5 * time.Second
	}
	base, cancel := context.WithCancel(context.Background())
	return &Cache{o: o, lru: expirable.NewLRU[string, *entry](o.Size, nil, o.TTL),
		refreshAfter: o.TTL.Milliseconds() * 3 / 4, base: base, cancel: cancel}
}

// Close ends the reads in flight that nobody waits for.
func (c *Cache) Close() { c.cancel() }

// Len is how many buckets' records the cache holds.
func (c *Cache) Len() int { return c.lru.Len() }

// Get returns the records of (entity, resource), from the cache or read
// within ctx.
func (c *Cache) Get(ctx context.Context, entity, resource string) (*Set, error) {
	set, p := c.Lookup(entity, resource)
	if set != nil {
		return set, nil
	}
	return p.Wait(ctx)
}

// Lookup is Get without the wait: the records of (entity, resource) when
// the cache holds them, or nil and the read it has started (shared with
// any other in flight), for the caller to wait on when it needs them.
func (c *Cache) Lookup(entity, resource string) (*Set, Pending) {
	key := entity + "\x00" + resource
	if e, ok := c.lru.Get(key); ok {
		c.o.Hits.Add(1)
		if c.o.Now()-e.at >= c.refreshAfter && e.refreshing.CompareAndSwap(false, true) {
			// A failed refresh is not retried: the entry expires at its
			// TTL and the next lookup reads, as a miss.
			c.flight.DoChan(key, func() (any, error) { return c.load(key, entity, resource) })
		}
		return e.set, Pending{}
	}
	c.o.Misses.Add(1)
	return nil, Pending{entity, resource, c.flight.DoChan(key, func() (any, error) { return c.load(key, entity, resource) })}
}

// Pending is a read of one bucket's records that has started and not
// yet been waited for.
type Pending struct {
	entity, resource string
	ch               <-chan singleflight.Result
}

// Wait returns the records p reads, or ctx's error when ctx ends first.
// Records already read are returned even if ctx has ended.
func (p Pending) Wait(ctx context.Context) (*Set, error) {
	select {
	case res := <-p.ch:
		return result(res)
	default:
	}
	select {
	case res := <-p.ch:
		return result(res)
	case <-ctx.Done():
		return nil, fmt.Errorf("config records of %q/%q: %w", p.entity, p.resource, ctx.Err())
	}
}

func result(res singleflight.Result) (*Set, error) {
	if res.Err != nil {
		return nil, res.Err
	}
	return res.Val.(*Set), nil
}

// load reads key's records and caches them.
func (c *Cache) load(key, entity, resource string) (*Set, error) {
	ctx, cancel := context.WithTimeout(c.base, c.o.ReadTimeout)
	defer cancel()
	s, err := c.o.Fetch(ctx, entity, resource)
	if err != nil {
		return nil, err
	}
	c.lru.Add(key, &entry{set: s, at: c.o.Now()})
	return s, nil
}
