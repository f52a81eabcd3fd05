package redis

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/recordcache"
)

// Fields of a config record's hash (levels 1 to 4): per limit
// l_{limit}_{ra,rp,bx,cp,cost}, as the DynamoDB backend names its
// attributes, and ttl (epoch seconds) on a sync-written entity config,
// whose key also expires then. A limit name may hold any character, so
// the field is whatever follows the last '_'.
const (
	configPrefix  = "l_"
	fieldAmount   = "ra"
	fieldPeriod   = "rp"
	fieldBurst    = "bx"
	fieldCapacity = "cp"
	fieldCost     = "cost"
	fieldTTL      = "ttl"
	// fieldCalendar is a budget's calendar, "month/Europe/Berlin"
	// (bucket.Limit.CalendarKey); absent for a rate.
	fieldCalendar = "pd"
)

// Fields of an entity's META hash.
const (
	fieldParent  = "parent"
	fieldCascade = "cascade"
)

// recordFields lays out rec's limits as the fields of a config hash.
func recordFields(limits []bucket.Limit) []string {
	out := make([]string, 0, 10*len(limits))
	for _, l := range limits {
		cost := "hits"
		if l.PerRequest {
			cost = "request"
		}
		f := func(name string) string { return configPrefix + l.Name + "_" + name }
		out = append(out,
			f(fieldAmount), strconv.FormatInt(l.Amount, 10),
			f(fieldPeriod), strconv.FormatInt(l.Period, 10),
			f(fieldBurst), strconv.FormatInt(l.Burst, 10),
			f(fieldCapacity), strconv.FormatInt(l.Amount, 10),
			f(fieldCost), cost)
		if l.Debt != 0 {
			out = append(out, f(fieldDebt), strconv.FormatInt(max(l.Debt, bucket.NoDebt), 10))
		}
		if l.IsBudget() {
			out = append(out, f(fieldCalendar), l.CalendarKey())
		}
	}
	return out
}

// decodeRecord reads a config hash; an empty hash is a record that does
// not exist, and so is a sync-written one whose ttl has passed (Redis
// drops its key then; a replica whose clock runs ahead must not use it
// meanwhile).
func decodeRecord(h map[string]string, nowMs int64) (backend.Record, bool, error) {
	if len(h) == 0 {
		return backend.Record{}, false, nil
	}
	var rec backend.Record
	if v, ok := h[fieldTTL]; ok {
		ttl, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return backend.Record{}, false, fmt.Errorf("ttl %q is not an integer", v)
		}
		if ttl*1000 <= nowMs {
			return backend.Record{}, false, nil
		}
		rec.Synced = true
	}
	type parts struct {
		n         map[string]int64
		cost, cal string
	}
	byName := map[string]*parts{}
	for field, v := range h {
		rest, ok := strings.CutPrefix(field, configPrefix)
		i := strings.LastIndexByte(rest, '_')
		if !ok || i <= 0 {
			continue
		}
		name, what := rest[:i], rest[i+1:]
		p := byName[name]
		if p == nil {
			p = &parts{n: map[string]int64{}}
			byName[name] = p
		}
		if what == fieldCost {
			p.cost = v
			continue
		}
		if what == fieldCalendar {
			p.cal = v
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return backend.Record{}, false, fmt.Errorf("field %s: %q is not an integer", field, v)
		}
		p.n[what] = n
	}
	names := make([]string, 0, len(byName))
	for name := range byName {
		names = append(names, name)
	}
	slices.Sort(names) // a hash has no order; keep limits in a stable one
	for _, name := range names {
		p := byName[name]
		l := bucket.Limit{Name: name, Amount: p.n[fieldAmount], Period: p.n[fieldPeriod], Burst: p.n[fieldBurst], Debt: p.n[fieldDebt]}
		var err error
		if l.Calendar, l.Zone, err = bucket.ParseCalendarKey(p.cal); err != nil {
			return backend.Record{}, false, fmt.Errorf("limit %q: %w", name, err)
		}
		switch p.cost {
		case "", "hits":
		case "request":
			l.PerRequest = true
		default:
			return backend.Record{}, false, fmt.Errorf("limit %q: cost %q (want hits or request)", name, p.cost)
		}
		if err := l.Validate(); err != nil {
			return backend.Record{}, false, err
		}
		rec.Limits = append(rec.Limits, l)
	}
	return rec, true, nil
}

// metaFields lays out an entity's META (backend.Entity: its parent, and
// whether its requests cascade to the parent's buckets too) as the fields
// of its hash.
func metaFields(e backend.Entity) []string {
	cascade := "0"
	if e.Cascade {
		cascade = "1"
	}
	return []string{fieldParent, e.Parent, fieldCascade, cascade}
}

func decodeEntity(name string, h map[string]string) backend.Entity {
	return backend.Entity{Name: name, Parent: h[fieldParent], Cascade: h[fieldCascade] == "1"}
}

// records reads the config records of a bucket, and its entity's META,
// through the shared cache (backend/recordcache).
type records struct {
	client rueidis.Client
	round  func(ctx context.Context, op string, fn func(context.Context) error) error
	keys   Keys
	now    func() int64
	cache  *recordcache.Cache
}

// readTimeout bounds one shared read of config records: the callers
// waiting on it each give up at their own deadline.
const readTimeout = 5 * time.Second

func newRecords(client rueidis.Client, keys Keys, round func(context.Context, string, func(context.Context) error) error, o recordcache.Options) *records {
	r := &records{client: client, round: round, keys: keys, now: o.Now}
	o.Fetch, o.ReadTimeout = r.fetch, readTimeout
	r.cache = recordcache.New(o)
	return r
}

func (r *records) get(ctx context.Context, entity, resource string) (*recordcache.Set, error) {
	return r.cache.Get(ctx, entity, resource)
}

func (r *records) close() { r.cache.Close() }

// fetch reads the four levels' hashes and the entity's META in one
// pipelined batch (in a Cluster, one per node that holds any of them).
func (r *records) fetch(ctx context.Context, entity, resource string) (*recordcache.Set, error) {
	rs := &recordcache.Set{}
	type slot struct {
		key string
		rec *backend.Record
		has *bool
	}
	slots := []slot{
		{r.keys.EntityConfig(entity, backend.DefaultResource), &rs.EntityDefaultConfig, &rs.HasEntityDefaultConfig},
		{r.keys.ResourceConfig(resource), &rs.ResourceConfig, &rs.HasResourceConfig},
		{r.keys.SystemConfig(), &rs.SystemConfig, &rs.HasSystemConfig},
	}
	// For resource _default_, levels 1 and 2 are one record, which the
	// Set answers from EntityDefaultConfig.
	if resource != backend.DefaultResource {
		slots = append(slots, slot{r.keys.EntityConfig(entity, resource), &rs.EntityConfig, &rs.HasEntityConfig})
	}
	cmds := make(rueidis.Commands, 0, len(slots)+1)
	for _, s := range slots {
		cmds = append(cmds, r.client.B().Hgetall().Key(s.key).Build())
	}
	cmds = append(cmds, r.client.B().Hgetall().Key(r.keys.Meta(entity)).Build())
	var res []rueidis.RedisResult
	err := r.round(ctx, "HGETALL", func(ctx context.Context) error {
		res = r.client.DoMulti(ctx, cmds...)
		for _, x := range res {
			if err := x.Error(); err != nil && !rueidis.IsRedisNil(err) {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading config records of %q/%q: %w", entity, resource, err)
	}
	now := r.now()
	for i, s := range slots {
		h, err := res[i].AsStrMap()
		if err != nil {
			return nil, fmt.Errorf("reading config records of %q/%q: %w", entity, resource, err)
		}
		if *s.rec, *s.has, err = decodeRecord(h, now); err != nil {
			return nil, fmt.Errorf("config record %s: %w", s.key, err)
		}
	}
	meta, err := res[len(slots)].AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("reading the META of %q: %w", entity, err)
	}
	if e := decodeEntity(entity, meta); e.Cascade {
		rs.Parent = e.Parent
	}
	return rs, nil
}
