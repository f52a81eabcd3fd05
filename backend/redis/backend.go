package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/lease"
	"github.com/sluice-rl/sluice/backend/recordcache"
	"github.com/sluice-rl/sluice/backend/usage"
)

// Options configure a Backend. Zero values take the defaults named on
// each field.
type Options struct {
	// KeyPrefix is the first segment of every key (DefaultPrefix), so
	// several deployments can share one Redis.
	KeyPrefix string
	// TTLMultiplier scales a default-sourced bucket's time to fill into
	// its TTL (ADR-119: 7). Zero or less turns TTL management off.
	TTLMultiplier int64
	// ConfigCacheTTL is how long config records read from Redis are
	// reused (60 s); ConfigCacheSize bounds how many buckets' records are
	// kept (100,000).
	ConfigCacheTTL  time.Duration
	ConfigCacheSize int
	// Global is the part of a limit marked global this replica enforces
	// (its region's); the zero Global enforces it whole.
	Global backend.Global
	// Now returns the time in epoch milliseconds; nil is the wall clock.
	// Buckets are refilled by this clock, as on DynamoDB, so replicas
	// need synchronised clocks (NTP's milliseconds are plenty).
	Now func() int64
	// OnBucketWrite, when set, hears every bucket written with the TTL it
	// was given (0: never expires), so the TTL distribution can be
	// monitored (ADR-031).
	OnBucketWrite func(ttl time.Duration)
	// MaxBatch bounds how many of this replica's decisions are decided
	// together in one run of the script (128). While a run is in flight
	// (on a Cluster: a run for the same hash tag), later decisions wait
	// and then go together, whatever buckets they are on: one round trip
	// and one script for all of them. 1 turns sharing off: each decision
	// runs on its own, at once.
	MaxBatch int
	// Call, when set, runs each Redis round trip (op "EVALSHA" for a
	// decision's script, "HGETALL" for a batch of config reads), so that
	// they can be timed and traced; it must call fn with a context
	// derived from ctx and return its error.
	Call func(ctx context.Context, op string, fn func(context.Context) error) error
	// LeaseHorizon is how long a lease of tokens this replica moves out
	// of a bucket should last at its own recent demand; 0 or less: no
	// leases, every decision runs the script. See leases.go.
	LeaseHorizon time.Duration
	// LeaseShare is the part of a limit's burst the fleet's leases may
	// hold together (lease.DefaultShare).
	LeaseShare float64
}

// round runs one Redis round trip through Options.Call.
func (o *Options) round(ctx context.Context, op string, fn func(context.Context) error) error {
	if o.Call == nil {
		return fn(ctx)
	}
	return o.Call(ctx, op, fn)
}

// Stats are a Backend's running totals, for metrics and benchmarks.
type Stats struct {
	// Scripts counts runs of the decision script: Redis round trips on
	// the decision path.
	Scripts atomic.Uint64
	// ScriptErrors counts runs that failed (Redis unreachable, late, or
	// refusing the write).
	ScriptErrors atomic.Uint64
	// Coalesced counts decisions that went in another's run of the
	// script: the round trips that coalescing saved.
	Coalesced atomic.Uint64
	// CacheHits and CacheMisses count config-record lookups answered
	// from the cache and those that waited for a read.
	CacheHits, CacheMisses atomic.Uint64
	// LocalAnswers counts decisions answered with no round trip of their
	// own (leases on): paid from a lease, or denied from the bucket as
	// this replica saw it within the last second, and its lease.
	LocalAnswers atomic.Uint64
	// LeaseStats are the leases' totals (leases on): moved in and out,
	// dropped, held now, the runs that moved them, and the decisions
	// denied at their deadline without Redis's answer.
	backend.LeaseStats
}

// Backend keeps token buckets in Redis. It is safe for concurrent use.
// The client belongs to the caller, who closes it after Close.
type Backend struct {
	client  rueidis.Client
	keys    Keys
	opts    Options
	records *records
	script  *rueidis.Lua
	stats   *Stats
	// batches is nil when sharing is off (MaxBatch 1).
	batches *batcher
	// cluster: the client is a Redis Cluster's, whose scripts may only
	// touch keys of one slot.
	cluster bool
	// leases is nil when leases are off; rtt is the measured round trip
	// of a run of the script.
	leases *backend.Leases[string]
	rtt    backend.RoundTrip
	// bg runs the work that outlives calls (lease calls whose callers
	// may have gone, renewals, returns, the sweep) until Close.
	bg *backend.Background
	// moving keeps the share records of global keys and counts what
	// they are asked; nil unless Options.Global moves. replica
	// names this replica's usage fields.
	moving  *backend.Moving
	replica usage.Replica
}

// New returns a Backend on client. It does not call Redis; see Ping.
func New(client rueidis.Client, opts Options) (*Backend, error) {
	keys, err := NewKeys(opts.KeyPrefix)
	if err != nil {
		return nil, err
	}
	if opts.ConfigCacheTTL <= 0 {
		opts.ConfigCacheTTL = time.Minute
	}
	if opts.ConfigCacheSize <= 0 {
		opts.ConfigCacheSize = 100_000
	}
	if opts.Now == nil {
		opts.Now = func() int64 { return time.Now().UnixMilli() }
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 128
	}
	stats := &Stats{}
	b := &Backend{
		cluster: client.Mode() == rueidis.ClientModeCluster,
		client:  client, keys: keys, opts: opts, stats: stats,
		records: newRecords(client, keys, opts.round, recordcache.Options{Size: opts.ConfigCacheSize, TTL: opts.ConfigCacheTTL,
			Now: opts.Now, Hits: &stats.CacheHits, Misses: &stats.CacheMisses}),
		// EVALSHA, and EVAL once when the server does not know the
		// script (after a restart or SCRIPT FLUSH).
		script: rueidis.NewLuaScript(decideLua),
	}
	if opts.MaxBatch > 1 {
		b.batches = newBatcher(opts.MaxBatch, b.script1)
	}
	b.bg = backend.NewBackground()
	if opts.Global.Moves() {
		if b.moving, err = backend.NewMoving(opts.Global, b.readShare, b.writeUsage, opts.ConfigCacheSize, opts.Now); err != nil {
			return nil, err
		}
		if b.replica, err = usage.NewReplica(); err != nil {
			return nil, err
		}
		b.bg.Go(func() { b.moving.Report(b.bg.SweepContext()) })
	}
	if opts.LeaseHorizon > 0 {
		b.leases = backend.NewLeases(lease.Policy{Horizon: opts.LeaseHorizon.Milliseconds(), Share: opts.LeaseShare},
			&stats.LeaseStats, func(x, y string) bool { return x < y })
		b.bg.Go(func() { b.leases.Sweep(b.bg.SweepContext(), opts.Now, b.returnLease) })
	}
	return b, nil
}

// Stats returns the backend's running totals.
func (b *Backend) Stats() *Stats { return b.stats }

// ConfigCacheLen is how many buckets' config records the cache holds.
func (b *Backend) ConfigCacheLen() int { return b.records.cache.Len() }

// LeaseHorizon is the horizon leases are sized for; 0 when leases are off.
func (b *Backend) LeaseHorizon() time.Duration {
	if b.leases == nil {
		return 0
	}
	return b.opts.LeaseHorizon
}

// Close gives every lease back to its bucket (after the runs in flight
// land, within 5 s each way: what it cannot return is lost to the bucket
// until it refills, as in a crash) and ends the config reads and the
// work in the background. It does not close the client, which must stay
// open until Close returns; the Backend must not be used after it.
func (b *Backend) Close() error {
	if !b.bg.Close(closeTimeout) {
		return nil
	}
	err := b.returnLeases()
	b.records.close()
	return err
}

// Ping reports whether Redis answers.
func (b *Backend) Ping(ctx context.Context) error {
	if err := b.client.Do(ctx, b.client.B().Ping().Build()).Error(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	return nil
}

// maxChain bounds the chain of cascade parents followed to find a
// bucket's top entity; a longer chain (or a cycle) ends there.
const maxChain = 8

// top is the end of the chain of cascade parents that starts at entity
// (whose records are rs): the hash tag of its bucket and of its
// children's. Each link's META is read through the record cache.
func (b *Backend) top(ctx context.Context, entity string, rs *recordcache.Set, resource string) (string, error) {
	for range maxChain {
		if rs.Parent == "" || rs.Parent == entity {
			break
		}
		entity = rs.Parent
		var err error
		if rs, err = b.records.get(ctx, entity, resource); err != nil {
			return "", err
		}
	}
	return entity, nil
}

// far caps a TTL: about 35,000 years in ms, "never" for any bucket, and
// far from overflowing Redis's expiry clock.
const far = int64(1) << 50

// Decide implements backend.Backend: the limits are resolved in Go (from
// the cache, most of the time), then one run of the decision script
// decides and writes every bucket the request is charged to.
func (b *Backend) Decide(ctx context.Context, req *backend.Request) (backend.Decision, error) {
	var resBuf [2]backend.Resolved
	p := &pending{ctx: ctx}
	res, bs := resBuf[:0], p.bucketBuf[:0]
	sets := [2]*recordcache.Set{}
	var err error
	b.moving.Prefetch(ctx, req)
	if sets[0], err = b.records.get(ctx, req.Entity, req.Resource); err != nil {
		return backend.Decision{}, err
	}
	// The parent comes from the rule's parent template, else from the
	// entity's META when it asks for cascade.
	entities := [2]string{req.Entity, req.Parent}
	if entities[1] == "" {
		entities[1] = sets[0].Parent
	}
	top := ""
	if entities[1] == req.Entity {
		entities[1] = ""
	} else if entities[1] != "" {
		if sets[1], err = b.records.get(ctx, entities[1], req.Resource); err != nil {
			return backend.Decision{}, err
		}
		if top, err = b.top(ctx, entities[1], sets[1], req.Resource); err != nil {
			return backend.Decision{}, err
		}
	}
	level := backend.LevelNone
	for i, entity := range entities {
		if entity == "" {
			continue
		}
		r, err := backend.Resolve(ctx, sets[i], entity, req.Resource, req.Defaults)
		if err != nil {
			return backend.Decision{}, err
		}
		if r, err = b.opts.Global.Enforce(ctx, req, entity, r, b.moving); err != nil {
			return backend.Decision{}, err
		}
		if i == 0 {
			level = r.Level
		}
		if len(r.Limits) > 0 {
			res = append(res, r)
			bs = append(bs, b.plan(r, b.keys.Bucket(entity, req.Resource, top)))
		}
	}
	if len(bs) == 0 {
		return backend.NotLimited(), nil
	}
	// One bucket's limits are its resolved ones, shared (Decision.Limits
	// is read-only).
	limits := bs[0].limits
	if len(bs) > 1 {
		limits = slices.Concat(bs[0].limits, bs[1].limits)
	}
	if b.leases != nil && !req.Bulk {
		d, err := b.leasedDecide(ctx, req, res, bs, limits, level)
		if err == nil && b.opts.OnBucketWrite != nil && d.Allowed && (req.Hits > 0 || req.Refund) {
			for _, r := range res {
				b.opts.OnBucketWrite(backend.TTLDuration(backend.BucketTTL(r, b.opts.TTLMultiplier)))
			}
		}
		return d, err
	}
	p.buckets = bs
	p.call = scriptCall{refund: req.Refund, charge: req.Charge && !req.Refund, costs: costs(req, limits, p.costBuf[:0])}
	if err := b.run(ctx, p); err != nil {
		return backend.Decision{}, fmt.Errorf("redis: bucket %q/%q: %w", req.Entity, req.Resource, err)
	}
	results, err := resultsOf(req, limits, p.call.costs, nil, p.after, p.allowed, p.holds, p.now)
	if err != nil {
		return backend.Decision{}, fmt.Errorf("redis: bucket %q/%q: %w", req.Entity, req.Resource, err)
	}
	if b.opts.OnBucketWrite != nil && (p.allowed || p.call.charge) && (req.Hits > 0 || req.Refund) {
		for _, r := range res {
			b.opts.OnBucketWrite(backend.TTLDuration(backend.BucketTTL(r, b.opts.TTLMultiplier)))
		}
	}
	return backend.Decision{Allowed: p.allowed, Limits: limits, Results: results,
		Binding: bucket.Binding(limits, results), Level: level}, nil
}

// run decides p and fills in its answer: in a run of
// its own, or with the other calls of this replica that arrive while a
// run of their lane is in flight (Options.MaxBatch). It returns by ctx's
// deadline at the latest.
func (b *Backend) run(ctx context.Context, p *pending) error {
	if b.batches == nil {
		b.script1([]*pending{p})
		return p.err
	}
	return b.batches.do(ctx, b.lane(p.buckets), p)
}

// lane names the calls that may share a run of the script: on one Redis,
// all of them; on a Cluster, whose scripts may only touch one slot, those
// whose buckets share a hash tag (a cascade's buckets share one).
func (b *Backend) lane(bs []scriptBucket) string {
	if !b.cluster {
		return ""
	}
	return hashTag(bs[0].key)
}

// script1 runs the script once for batch and answers every call of it,
// waking the followers. Calls on the same buckets under the same limits
// form one group, decided in arrival order.
func (b *Backend) script1(batch []*pending) {
	ctxs := make([]context.Context, len(batch))
	for i, p := range batch {
		ctxs[i] = p.ctx
	}
	groups, at := groupCalls(batch)
	ctx, cancel := backend.BatchContext(ctxs)
	defer cancel()
	now := b.opts.Now()
	keys, argv := scriptArgs(now, b.leaseWindow(), groups)
	b.stats.Scripts.Add(1)
	b.stats.Coalesced.Add(uint64(len(batch) - 1))
	var reply []rueidis.RedisMessage
	err := b.opts.round(ctx, "EVALSHA", func(ctx context.Context) (err error) {
		reply, err = b.script.Exec(ctx, b.client, keys, argv).ToArray()
		return err
	})
	var rs []groupReply
	if err != nil {
		b.stats.ScriptErrors.Add(1)
	} else {
		rs, err = parseReply(groups, reply)
	}
	for i, p := range batch {
		p.now, p.err = now, err
		if err == nil {
			r := rs[at[i].group]
			if p.err = r.err; p.err == nil {
				p.allowed, p.after = r.allowed[at[i].call], r.after[at[i].call]
				if r.granted != nil {
					p.granted, p.cut, p.kept = r.granted[at[i].call], r.cut[at[i].call], r.kept[at[i].call]
				}
				if r.held != nil {
					p.holds = r.held[at[i].call]
				}
				if p.landed != nil {
					p.landed(p)
				}
			}
		}
		if p.follower {
			p.wake <- struct{}{}
		}
	}
}

// leaseWindow is the width (ms) of the windows leases expire in: its
// leases', or, without leases, any (nothing is leased).
func (b *Backend) leaseWindow() int64 {
	if b.leases == nil {
		return bucket.ExpiryMargin
	}
	return b.leases.LeaseWindowMs()
}

// callAt is where a call of a batch went: its group, and its place there.
type callAt struct{ group, call int }

// groupCalls sorts batch's calls into groups, in order of first arrival,
// each call in arrival order in its group, and says where each went. The
// groups' calls share one slice, so a batch costs a few allocations
// however many groups it has.
func groupCalls(batch []*pending) ([]scriptGroup, []callAt) {
	at := make([]callAt, len(batch))
	if len(batch) == 1 {
		return []scriptGroup{{buckets: batch[0].buckets, calls: []scriptCall{batch[0].call}}}, at
	}
	groups := make([]scriptGroup, 0, len(batch))
	counts := make([]int, 0, len(batch))
	// The first group whose first bucket has a key: a key rarely has
	// more than one (its limits changed, or a cascade's parent differs),
	// and then the others are found by a scan.
	byKey := make(map[string]int, len(batch))
	for i, p := range batch {
		g, known := byKey[p.buckets[0].key]
		if known && !sameBuckets(groups[g].buckets, p.buckets) {
			g = slices.IndexFunc(groups, func(o scriptGroup) bool { return sameBuckets(o.buckets, p.buckets) })
		}
		if !known || g < 0 {
			if !known {
				byKey[p.buckets[0].key] = len(groups)
			}
			g = len(groups)
			groups = append(groups, scriptGroup{buckets: p.buckets})
			counts = append(counts, 0)
		}
		at[i] = callAt{group: g, call: counts[g]}
		counts[g]++
	}
	calls := make([]scriptCall, len(batch))
	for g := range groups {
		groups[g].calls, calls = calls[:counts[g]:counts[g]], calls[counts[g]:]
	}
	for i, p := range batch {
		groups[at[i].group].calls[at[i].call] = p.call
	}
	return groups, at
}

// sameBuckets reports whether calls on a and on b may be one group: the
// same buckets with the same limits and TTLs.
func sameBuckets(a, b []scriptBucket) bool {
	return slices.EqualFunc(a, b, func(x, y scriptBucket) bool {
		return x.key == y.key && x.cfg == y.cfg && x.ttlMs == y.ttlMs && slices.Equal(x.limits, y.limits)
	})
}

// costs appends to out what req costs each of limits, or for a refund
// what it gives back.
func costs(req *backend.Request, limits []bucket.Limit, out []int64) []int64 {
	for i, l := range limits {
		switch {
		case req.Refund:
			out = append(out, bucket.RefundAmount(l, req.Hits))
		case req.Charge && i < len(req.Paid):
			// What this replica's lease paid of a charge already.
			out = append(out, max(bucket.Cost(l, req.Hits)-req.Paid[i], 0))
		default:
			out = append(out, bucket.Cost(l, req.Hits))
		}
	}
	return out
}

// plan is what the script needs of the bucket at key whose limits
// resolved to r: the limits, and the TTL it gets if written.
func (b *Backend) plan(r backend.Resolved, key string) scriptBucket {
	ttl, ok := backend.BucketTTL(r, b.opts.TTLMultiplier)
	switch {
	case !ok:
		ttl = 0 // the script's "never expires"
	case ttl < 1:
		ttl = 1
	case ttl > far:
		ttl = far
	}
	return scriptBucket{key: key, cfg: bucket.Fingerprint(r.Limits), limits: r.Limits, ttlMs: ttl}
}

// errDisagree is a script whose decision is not the one backend/bucket
// makes from the states it reports: a bug, never to be answered from.
var errDisagree = errors.New("the decision script and backend/bucket disagree")

// resultsOf is the Results backend/bucket gives for req on the states the
// script left. A decision's states before the charge are those after it
// plus the costs when it was allowed (the same states when denied) and
// what this replica's leases hold on top of the bucket after it (held,
// nil for none: a lease call's grant, and for an admission what its lease
// holds besides), so bucket.Decide is run again on them here: the answers
// are its own, and it must agree with the script on the outcome. A
// refund's results are its states after.
func resultsOf(req *backend.Request, limits []bucket.Limit, costs, held []int64, after []bucket.State, allowed bool, holds []bool, now int64) ([]bucket.Result, error) {
	results := make([]bucket.Result, len(limits))
	if req.Refund {
		for i, l := range limits {
			s := after[i]
			results[i] = bucket.Result{Tokens: s.Tokens, Allowed: true, Wait: bucket.Wait(l, s, l.Burst, now)}
		}
		return results, nil
	}
	if req.Charge {
		if len(holds) != len(limits) {
			return nil, errDisagree
		}
		return chargedResults(limits, costs, held, after, holds, now), nil
	}
	before := make([]bucket.State, len(limits))
	for i := range limits {
		before[i] = bucket.State{Tokens: after[i].Tokens, Clock: after[i].Clock}
		if allowed {
			before[i].Tokens += costs[i]
		}
		if i < len(held) {
			before[i].Tokens += held[i]
		}
	}
	if bucket.Decide(limits, before, req.Hits, now, results) != allowed {
		return nil, errDisagree
	}
	return results, nil
}

// chargedResults are the results of a charge the script made, from the
// states it left (after; held is what this replica's leases hold on top,
// nil without leases) and whether each limit held its cost (holds).
func chargedResults(limits []bucket.Limit, costs, held []int64, after []bucket.State, holds []bool, now int64) []bucket.Result {
	results := make([]bucket.Result, len(limits))
	for i, l := range limits {
		s := after[i]
		if i < len(held) {
			s.Tokens += held[i]
		}
		results[i] = bucket.Charged(l, s, costs[i], holds[i], now)
	}
	return results
}
