// Package sharecache keeps the share records of global keys
// (regions.Record) that a replica read from its region's store, each for
// at most a time the regions' clock allows (regions.Clock.CacheFor): past
// it, the record is read again before the next decision on its key, so
// that a loan its region made is in force on the replica before the
// borrower may use it. From half that time on, a key in use has its
// record read again in the background, so its decisions do not wait.
//
// A read that fails is not kept: the next decision reads again, and the
// caller fails its decision meanwhile. A record is never taken as absent
// because it could not be read, which would enforce the region's whole
// base while loans out of it are in force elsewhere.
package sharecache

import (
	"context"
	"fmt"
	"strconv"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/singleflight"

	"github.com/sluice-rl/sluice/regions"
)

// Read reads the share record of entity's bucket for resource from the
// store; none stored is the zero Record and no error.
type Read func(ctx context.Context, entity, resource string) (regions.Record, error)

// Cache is a replica's share records, safe for concurrent use. Build one
// with New.
type Cache struct {
	read  Read
	ttl   int64 // ms
	now   func() int64
	lru   *lru.Cache[key, entry]
	group singleflight.Group
}

type key struct{ entity, resource string }

// readTimeout bounds one read of a record.
const readTimeout = 5 * time.Second

// entry is a record and when its read began: the table may have changed
// after that, so its age counts from there.
type entry struct {
	rec    regions.Record
	readAt int64
}

// New is a Cache of at most size records, each kept for ttl after the
// read that brought it began; now is the clock in epoch milliseconds.
func New(read Read, ttl time.Duration, size int, now func() int64) (*Cache, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("sharecache: a record must be kept for some time, not %v", ttl)
	}
	l, err := lru.New[key, entry](size)
	if err != nil {
		return nil, fmt.Errorf("sharecache: %w", err)
	}
	return &Cache{read: read, ttl: ttl.Milliseconds(), now: now, lru: l}, nil
}

// Get is the share record of entity's bucket for resource, from the
// cache while it is young enough, else read (one read for all callers
// that ask at once). Past half its time, a record is read again in the
// background while callers go on using it, so that a key in use never
// waits for its record: only a key's first decisions, and those after a
// read failed or took longer than half the time, do.
func (c *Cache) Get(ctx context.Context, entity, resource string) (regions.Record, error) {
	k := key{entity, resource}
	if e, ok := c.lru.Get(k); ok {
		switch age := c.now() - e.readAt; {
		case age < c.ttl/2:
			return e.rec, nil
		case age < c.ttl:
			c.load(ctx, k) // not waited for
			return e.rec, nil
		}
	}
	select {
	case r := <-c.load(ctx, k):
		if r.Err != nil {
			return regions.Record{}, r.Err
		}
		return r.Val.(regions.Record), nil
	case <-ctx.Done():
		return regions.Record{}, fmt.Errorf("reading the share of %q/%q: %w", entity, resource, ctx.Err())
	}
}

// Prefetch starts reading the share record of entity's bucket for
// resource unless the cache holds one younger than half its time, and
// does not wait for it: a key's first decision, which reads its config
// records before it asks for the share, finds the share read alongside
// them instead of after them.
func (c *Cache) Prefetch(ctx context.Context, entity, resource string) {
	k := key{entity, resource}
	if e, ok := c.lru.Peek(k); ok && c.now()-e.readAt < c.ttl/2 {
		return
	}
	c.load(ctx, k)
}

// load reads k's record into the cache, once for all who ask while it
// runs. The read outlives a caller that gives up, within a timeout of its
// own.
func (c *Cache) load(ctx context.Context, k key) <-chan singleflight.Result {
	// A length prefix keeps any two keys apart, whatever bytes they hold.
	return c.group.DoChan(strconv.Itoa(len(k.entity))+":"+k.entity+k.resource, func() (any, error) {
		start := c.now()
		if e, ok := c.lru.Peek(k); ok && start-e.readAt < c.ttl/2 {
			// A caller that saw the record old asked just as a read
			// ended: that read is fresh, and another would be wasted.
			return e.rec, nil
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readTimeout)
		defer cancel()
		rec, err := c.read(rctx, k.entity, k.resource)
		if err != nil {
			return nil, err
		}
		c.lru.Add(k, entry{rec: rec, readAt: start})
		return rec, nil
	})
}
