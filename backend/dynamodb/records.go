package dynamodb

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

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

// fetch reads the four records with one BatchGetItem. Keys DynamoDB
// leaves unprocessed are asked again (with backoff, within ctx), never
// taken as absent (pitfall 6): an absent answer is cached for the cache TTL.
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
	found := map[[2]string]map[string]types.AttributeValue{}
	pending := map[string]types.KeysAndAttributes{r.table: {Keys: keys}}
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt > 0 {
			if err := sleep(ctx, backoff(attempt)); err != nil {
				return nil, fmt.Errorf("config records of %q/%q: unprocessed keys left: %w", entity, resource, err)
			}
		}
		out, err := r.api.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{
			RequestItems:           pending,
			ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
		})
		r.stats.call("BatchGetItem", err)
		if err != nil {
			return nil, fmt.Errorf("reading config records of %q/%q: %w", entity, resource, err)
		}
		r.stats.consumedRead(each(out.ConsumedCapacity)...)
		for _, av := range out.Responses[r.table] {
			pk, _ := av[attrPK].(*types.AttributeValueMemberS)
			sk, _ := av[attrSK].(*types.AttributeValueMemberS)
			if pk != nil && sk != nil {
				found[[2]string{pk.Value, sk.Value}] = av
			}
		}
		pending = out.UnprocessedKeys
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
