package dynamodb

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/recordcache"
)

// records reads config records through the shared cache
// (backend/recordcache): a bounded LRU with the cache TTL, refreshed ahead
// of expiry, one read per key at a time.
type records struct {
	api   API
	table string
	keys  Keys
	now   func() int64
	stats *Stats
	cache *recordcache.Cache
	// along, when set, brings a bucket's own item along with the first
	// read of its config records.
	along bucketAlong
	// shared holds, per resource, the records every entity's resolution
	// of it shares (the resource default and the system default) as last
	// read, and ttl is how long they are trusted: they make the guess of
	// guess.
	shared *lru.Cache[string, sharedRecords]
	ttl    int64
}

// sharedRecords are the levels 3 and 4 of a resource, read at at.
type sharedRecords struct {
	set *recordcache.Set // only its resource and system records
	at  int64
}

// sharedResources bounds how many resources' shared records are kept
// for guesses: resources come from the rule files, so a few dozen is
// usual.
const sharedResources = 1024

// bucketAlong is what a config read needs from the bucket state kept
// beside it: a replica's first decision on a bucket reads the config
// records and then writes the bucket, and a write planned without the
// item's state (as a create) loses its race to the replicas that made the
// item already, costing a third round trip. Reading the item in the same
// BatchGetItem costs none.
type bucketAlong interface {
	// unseen reports whether this replica holds no state of k's bucket.
	unseen(k bucketKey) bool
	// readAlong records the bucket item read with its config (nil: no
	// item), unless a state of it was recorded meanwhile. An item it
	// cannot decode is left to the write path, which rebuilds it.
	readAlong(k bucketKey, av map[string]types.AttributeValue)
}

// readTimeout bounds one shared read of config records: the callers
// waiting on it each give up at their own deadline.
const readTimeout = 5 * time.Second

func newRecords(api API, table string, keys Keys, size int, ttl time.Duration, now func() int64, stats *Stats) *records {
	shared, _ := lru.New[string, sharedRecords](sharedResources) // only a size <= 0 fails
	r := &records{api: api, table: table, keys: keys, now: now, stats: stats, shared: shared, ttl: ttl.Milliseconds()}
	r.cache = recordcache.New(recordcache.Options{Fetch: r.fetch, Size: size, TTL: ttl, Now: now,
		Hits: &stats.CacheHits, Misses: &stats.CacheMisses, ReadTimeout: readTimeout})
	return r
}

func (r *records) close() { r.cache.Close() }

// guess is what (entity, resource)'s records probably are when the cache
// holds none: no records of the entity's own (the common case for the
// long tail of per-user and per-address keys) and the resource's shared
// records as last read for any entity. ok is false when those have not
// been read within the cache TTL.
func (r *records) guess(resource string) (*recordcache.Set, bool) {
	sh, ok := r.shared.Get(resource)
	if !ok || r.now()-sh.at >= r.ttl {
		return nil, false
	}
	return sh.set, true
}

func (r *records) get(ctx context.Context, entity, resource string) (*recordcache.Set, error) {
	return r.cache.Get(ctx, entity, resource)
}

// fetch reads the records of the four levels and the entity's META item
// with one BatchGetItem (batchGet): keys left unprocessed are asked again
// within ctx, never taken as absent, since an absent answer is cached for
// the cache TTL.
func (r *records) fetch(ctx context.Context, entity, resource string) (*recordcache.Set, error) {
	type slot struct {
		pk, sk string
		rec    *backend.Record
		has    *bool
	}
	rs := &recordcache.Set{}
	slots := []slot{
		{r.keys.EntityPK(entity), r.keys.ConfigSK(backend.DefaultResource), &rs.EntityDefaultConfig, &rs.HasEntityDefaultConfig},
		{r.keys.ResourcePK(resource), ResourceConfigSK(), &rs.ResourceConfig, &rs.HasResourceConfig},
		{r.keys.SystemPK(), ResourceConfigSK(), &rs.SystemConfig, &rs.HasSystemConfig},
	}
	// For resource _default_ levels 1 and 2 are one item, which Entity
	// answers from EntityDefaultConfig; BatchGetItem refuses a key asked twice.
	if resource != backend.DefaultResource {
		slots = append(slots, slot{r.keys.EntityPK(entity), r.keys.ConfigSK(resource), &rs.EntityConfig, &rs.HasEntityConfig})
	}
	metaKey := [2]string{r.keys.EntityPK(entity), MetaSK()}
	keys := make([]map[string]types.AttributeValue, 0, len(slots)+1)
	for _, s := range slots {
		keys = append(keys, map[string]types.AttributeValue{attrPK: str(s.pk), attrSK: str(s.sk)})
	}
	keys = append(keys, map[string]types.AttributeValue{attrPK: str(metaKey[0]), attrSK: str(metaKey[1])})
	// The bucket's item comes along when this replica has no state of it
	// yet, which is only on the first read. It is read strongly
	// consistent, like every other view a decision may deny from; so is
	// the rest of that one batch, since BatchGetItem asks it per table.
	bk := bucketKey{entity, resource}
	along := r.along != nil && r.along.unseen(bk)
	bucketPK := [2]string{r.keys.EntityPK(entity), r.keys.BucketSK(resource)}
	if along {
		keys = append(keys, map[string]types.AttributeValue{attrPK: str(bucketPK[0]), attrSK: str(bucketPK[1])})
	}
	found, err := batchGet(ctx, r.api, r.table, keys, along, 0, r.stats)
	now := r.now()
	if err != nil {
		return nil, fmt.Errorf("reading config records of %q/%q: %w", entity, resource, err)
	}
	if along {
		r.along.readAlong(bk, found[bucketPK])
	}
	if meta := decodeEntity(found[metaKey]); meta.Cascade {
		rs.Parent = meta.Parent
	}
	for _, s := range slots {
		rec, ok, err := decodeRecord(found[[2]string{s.pk, s.sk}], now)
		if err != nil {
			return nil, fmt.Errorf("config record %s %s: %w", s.pk, s.sk, err)
		}
		*s.rec, *s.has = rec, ok
	}
	r.shared.Add(resource, sharedRecords{at: now, set: &recordcache.Set{
		ResourceConfig: rs.ResourceConfig, HasResourceConfig: rs.HasResourceConfig,
		SystemConfig: rs.SystemConfig, HasSystemConfig: rs.HasSystemConfig}})
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
