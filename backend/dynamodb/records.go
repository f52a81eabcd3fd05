package dynamodb

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/hashicorp/golang-lru/v2/expirable"
	"golang.org/x/sync/singleflight"

	"github.com/sluice-rl/sluice/backend"
)

// recordSet is what one bucket's resolution needs from the table: the
// records of levels 1 to 4, each possibly absent. It is cached whole, so
// a miss (nothing configured) is cached too.
type recordSet struct {
	entity, entityDefault, resource, system backend.Record
	hasEntity, hasEntityDefault, hasRes     bool
	hasSystem                               bool
	// parent is the entity's parent from its META item when that item
	// asks for cascade; "" otherwise.
	parent string

	at         int64       // when it was read (epoch ms)
	refreshing atomic.Bool // a read to replace it has started
}

// Entity, Resource and System let a recordSet stand in for the store in
// backend.Resolve, for the one bucket it was fetched for.
func (r *recordSet) Entity(_ context.Context, _, resource string) (backend.Record, bool, error) {
	if resource == backend.DefaultResource {
		return r.entityDefault, r.hasEntityDefault, nil
	}
	return r.entity, r.hasEntity, nil
}

func (r *recordSet) Resource(context.Context, string) (backend.Record, bool, error) {
	return r.resource, r.hasRes, nil
}

func (r *recordSet) System(context.Context) (backend.Record, bool, error) {
	return r.system, r.hasSystem, nil
}

// records reads config records through a bounded LRU whose entries live
// for the cache TTL (60 s by default): an operator's change reaches every
// replica within that time, and a warm bucket costs no config read at all.
//
// Reads stay off the decision path after warm-up: a lookup that finds an
// entry older than three quarters of the TTL answers from it and starts
// one read in the background to replace it, so a bucket in steady use
// never misses. Concurrent misses for one key share one read, which runs
// on its own deadline rather than the first caller's: a caller with
// Envoy's 20 ms may give up, but the read still lands in the cache for
// the next. No lock is held across I/O.
type records struct {
	api          API
	table        string
	keys         Keys
	now          func() int64
	cache        *expirable.LRU[string, *recordSet]
	refreshAfter int64 // ms
	flight       singleflight.Group
	stats        *Stats
	// base is cancelled by close, ending reads nobody waits for.
	base   context.Context
	cancel context.CancelFunc
}

// readTimeout bounds one shared read of config records: the callers
// waiting on it each give up at their own deadline.
const readTimeout = 5 * time.Second

func newRecords(api API, table string, keys Keys, size int, ttl time.Duration, now func() int64, stats *Stats) *records {
	base, cancel := context.WithCancel(context.Background())
	return &records{
		api: api, table: table, keys: keys, now: now, stats: stats,
		cache:        expirable.NewLRU[string, *recordSet](size, nil, ttl),
		refreshAfter: ttl.Milliseconds() * 3 / 4,
		base:         base, cancel: cancel,
	}
}

func (r *records) close() { r.cancel() }

func (r *records) get(ctx context.Context, entity, resource string) (*recordSet, error) {
	key := entity + "\x00" + resource
	if rs, ok := r.cache.Get(key); ok {
		r.stats.CacheHits.Add(1)
		if r.now()-rs.at >= r.refreshAfter && rs.refreshing.CompareAndSwap(false, true) {
			// A failed refresh is not retried: the entry expires at its
			// TTL and the next lookup reads, as a miss.
			r.flight.DoChan(key, func() (any, error) { return r.load(key, entity, resource) })
		}
		return rs, nil
	}
	r.stats.CacheMisses.Add(1)
	select {
	case res := <-r.flight.DoChan(key, func() (any, error) { return r.load(key, entity, resource) }):
		if res.Err != nil {
			return nil, res.Err
		}
		return res.Val.(*recordSet), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("config records of %q/%q: %w", entity, resource, ctx.Err())
	}
}

// load reads key's records and caches them.
func (r *records) load(key, entity, resource string) (*recordSet, error) {
	ctx, cancel := context.WithTimeout(r.base, readTimeout)
	defer cancel()
	rs, err := r.fetch(ctx, entity, resource)
	if err != nil {
		return nil, err
	}
	rs.at = r.now()
	r.cache.Add(key, rs)
	return rs, nil
}

// fetch reads the records of the four levels and the entity's META item
// with one BatchGetItem (batchGet): keys left unprocessed are asked again
// within ctx, never taken as absent, since an absent answer is cached for
// the cache TTL.
func (r *records) fetch(ctx context.Context, entity, resource string) (*recordSet, error) {
	type slot struct {
		pk, sk string
		rec    *backend.Record
		has    *bool
	}
	rs := &recordSet{}
	slots := []slot{
		{r.keys.EntityPK(entity), r.keys.ConfigSK(backend.DefaultResource), &rs.entityDefault, &rs.hasEntityDefault},
		{r.keys.ResourcePK(resource), ResourceConfigSK(), &rs.resource, &rs.hasRes},
		{r.keys.SystemPK(), ResourceConfigSK(), &rs.system, &rs.hasSystem},
	}
	// For resource _default_ levels 1 and 2 are one item, which Entity
	// answers from entityDefault; BatchGetItem refuses a key asked twice.
	if resource != backend.DefaultResource {
		slots = append(slots, slot{r.keys.EntityPK(entity), r.keys.ConfigSK(resource), &rs.entity, &rs.hasEntity})
	}
	metaKey := [2]string{r.keys.EntityPK(entity), MetaSK()}
	keys := make([]map[string]types.AttributeValue, 0, len(slots)+1)
	for _, s := range slots {
		keys = append(keys, map[string]types.AttributeValue{attrPK: str(s.pk), attrSK: str(s.sk)})
	}
	keys = append(keys, map[string]types.AttributeValue{attrPK: str(metaKey[0]), attrSK: str(metaKey[1])})
	found, err := batchGet(ctx, r.api, r.table, keys, false, 0, r.stats)
	if err != nil {
		return nil, fmt.Errorf("reading config records of %q/%q: %w", entity, resource, err)
	}
	if meta := decodeEntity(found[metaKey]); meta.Cascade {
		rs.parent = meta.Parent
	}
	now := r.now()
	for _, s := range slots {
		rec, ok, err := decodeRecord(found[[2]string{s.pk, s.sk}], now)
		if err != nil {
			return nil, fmt.Errorf("config record %s %s: %w", s.pk, s.sk, err)
		}
		*s.rec, *s.has = rec, ok
	}
	return rs, nil
}

// batchGetter is the BatchGetItem of API and AdminAPI.
type batchGetter interface {
	BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
}

// batchGet reads the items of keys (at most 100, BatchGetItem's limit)
// from table, with strong consistency if consistent, and returns those
// that exist by [PK, SK]. Keys DynamoDB leaves unprocessed are asked again
// with backoff, within ctx and, when maxAttempts > 0, in at most
// maxAttempts calls in all; they are never taken as absent (pitfall 6).
// With stats, every call and the read capacity it consumed are counted.
func batchGet(ctx context.Context, api batchGetter, table string, keys []map[string]types.AttributeValue, consistent bool, maxAttempts int, stats *Stats) (map[[2]string]map[string]types.AttributeValue, error) {
	found := make(map[[2]string]map[string]types.AttributeValue, len(keys))
	ka := types.KeysAndAttributes{Keys: keys}
	if consistent {
		ka.ConsistentRead = aws.Bool(true)
	}
	pending := map[string]types.KeysAndAttributes{table: ka}
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt > 0 {
			left := len(pending[table].Keys)
			if attempt == maxAttempts {
				return nil, fmt.Errorf("%d keys still unprocessed after %d attempts", left, attempt)
			}
			if err := sleep(ctx, backoff(attempt)); err != nil {
				return nil, fmt.Errorf("%d keys still unprocessed: %w", left, err)
			}
		}
		in := &dynamodb.BatchGetItemInput{RequestItems: pending}
		if stats != nil {
			in.ReturnConsumedCapacity = types.ReturnConsumedCapacityTotal
		}
		out, err := api.BatchGetItem(ctx, in)
		if stats != nil {
			stats.call("BatchGetItem", err)
			if err == nil {
				stats.consumedRead(each(out.ConsumedCapacity)...)
			}
		}
		if err != nil {
			return nil, err
		}
		for _, av := range out.Responses[table] {
			found[[2]string{attrS(av, attrPK), attrS(av, attrSK)}] = av
		}
		pending = out.UnprocessedKeys
	}
	return found, nil
}

// backoff is a jittered exponential delay for retry attempt n (n >= 1).
func backoff(n int) time.Duration {
	d := 5 * time.Millisecond << min(n-1, 6)
	return d/2 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func ceilSeconds(ms int64) int64 { return (ms + 999) / 1000 }
