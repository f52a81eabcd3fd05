package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/lease"
	"github.com/sluice-rl/sluice/backend/recordcache"
	"github.com/sluice-rl/sluice/backend/usage"
)

// API is the part of *dynamodb.Client the backend calls.
type API interface {
	GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(context.Context, *dynamodb.PutItemInput, ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	TransactWriteItems(context.Context, *dynamodb.TransactWriteItemsInput, ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
	DescribeTable(context.Context, *dynamodb.DescribeTableInput, ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
}

// Options configure a Backend. Table is required; zero values of the
// rest take the defaults named on each field.
type Options struct {
	Table string
	// KeyPrefix is put in front of every partition key, so several
	// deployments or test runs can share one table.
	KeyPrefix string
	// TTLMultiplier scales a default-sourced bucket's time to fill into
	// its TTL (ADR-119: 7). Zero or less turns TTL management off.
	TTLMultiplier int64
	// ConfigCacheTTL is how long resolved config records are reused
	// (60 s); ConfigCacheSize bounds how many buckets' records are kept
	// (100,000).
	ConfigCacheTTL  time.Duration
	ConfigCacheSize int
	// StateCacheSize bounds how many buckets' last seen state are kept
	// (100,000). A bucket whose state is known is decided and written with
	// one conditional UpdateItem and no read.
	StateCacheSize int
	// MaxBatch bounds how many decisions of one bucket are decided
	// together and written as one (256). While a write for a bucket is in
	// flight, later decisions for it wait and then share the next write.
	// 1 turns sharing off: each decision then writes on its own.
	MaxBatch int
	// MaxAttempts bounds the writes one decision tries when it loses races
	// to other writers (8).
	MaxAttempts int
	// MaxDenyStaleness is how old (at most) the last state this replica
	// saw of a bucket may be for a denial to be answered from it without
	// asking DynamoDB (1 s; negative: always ask). Other writers only take
	// tokens, so such a denial is right unless tokens were given back or a
	// limit raised elsewhere within that time.
	MaxDenyStaleness time.Duration
	// LeaseHorizon is how long a lease of tokens this replica takes from
	// a bucket should last at its own recent demand (DefaultLeaseHorizon;
	// negative: no leases, every allowed decision writes). See leases.
	LeaseHorizon time.Duration
	// LeaseShare is the part of a limit's burst the fleet's leases may
	// hold together (lease.DefaultShare).
	LeaseShare float64
	// Global is the part of a limit marked global this replica enforces
	// (its region's); the zero Global enforces it whole.
	Global backend.Global
	// Now returns the time in epoch milliseconds; nil is the wall clock.
	Now func() int64
	// OnBucketWrite, when set, hears every bucket written with the TTL it
	// was given (0: never expires), so the TTL distribution can be
	// monitored (ADR-031).
	OnBucketWrite func(ttl time.Duration)
}

// Backend keeps token buckets in DynamoDB (DESIGN section 6): one item per
// entity and resource holding every limit, written with conditional
// updates so that any number of Sluice replicas share one truth. It is
// safe for concurrent use.
type Backend struct {
	api     API
	table   string
	keys    Keys
	opts    Options
	now     func() int64
	records *records
	// rtt is the measured round trip of a bucket write, which times
	// lease renewals and sizes leases near the limit.
	rtt  backend.RoundTrip
	seen *lru.Cache[bucketKey, seenItem]
	// raced is when (epoch ms) a write of this replica on each bucket
	// last lost a race: another replica writes it too, so a bulk take
	// reads it before it writes (readFirst).
	raced *lru.Cache[bucketKey, int64]
	lanes *lanes
	stats *Stats
	// leases is nil when leases are off.
	leases *backend.Leases[bucketKey]
	// moving keeps the share records of global keys and counts what
	// they are asked; nil unless Options.Global moves. replica
	// names this replica's usage items.
	moving  *backend.Moving
	replica usage.Replica
	// bg runs the work that outlives calls (renewals, returns, the
	// sweep, detached writes) until Close.
	bg       *backend.Background
	closeErr error
}

// DefaultLeaseHorizon is how long a lease lasts at steady demand unless
// Options say otherwise. A lease is renewed each half horizon, so every
// bucket a replica uses costs about two writes a horizon however busy it
// is: with many warm keys that, not the traffic, sets the write rate.
// Thirty seconds keeps it low (a 300-key zipf load on three replicas:
// 0.06 writes per decision, against 0.14 at ten seconds, BENCHMARKS.md),
// and the size stays bounded by lease.DefaultShare of the burst and by
// what the bucket holds, whatever the horizon.
const DefaultLeaseHorizon = 30 * time.Second

type bucketKey struct{ entity, resource string }

// seenItem is the last state of a bucket this replica saw, and when.
type seenItem struct {
	item *bucketItem // nil: absent
	at   int64       // epoch ms
	// guessed: item is as a batch of guessed calls alone left it, having
	// created it (guessedOnly). If the guess was wrong, every token that
	// batch took went to answers decided again or to a lease under the
	// guessed limits (decideOnGuess).
	guessed bool
}

// New returns a Backend on api. It does not call DynamoDB; see CheckTable.
func New(api API, opts Options) (*Backend, error) {
	if opts.Table == "" {
		return nil, errors.New("dynamodb backend: no table named")
	}
	keys, err := NewKeys(opts.KeyPrefix)
	if err != nil {
		return nil, fmt.Errorf("dynamodb backend: %w", err)
	}
	if opts.ConfigCacheTTL <= 0 {
		opts.ConfigCacheTTL = time.Minute
	}
	if opts.ConfigCacheSize <= 0 {
		opts.ConfigCacheSize = 100_000
	}
	if opts.StateCacheSize <= 0 {
		opts.StateCacheSize = 100_000
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 256
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = 8
	}
	if opts.MaxDenyStaleness == 0 {
		opts.MaxDenyStaleness = time.Second
	}
	if opts.Now == nil {
		opts.Now = func() int64 { return time.Now().UnixMilli() }
	}
	seen, err := lru.New[bucketKey, seenItem](opts.StateCacheSize)
	if err != nil {
		return nil, fmt.Errorf("dynamodb backend: %w", err)
	}
	raced, err := lru.New[bucketKey, int64](opts.StateCacheSize)
	if err != nil {
		return nil, fmt.Errorf("dynamodb backend: %w", err)
	}
	if opts.LeaseHorizon == 0 {
		opts.LeaseHorizon = DefaultLeaseHorizon
	}
	stats := newStats()
	b := &Backend{
		api: api, table: opts.Table, keys: keys, opts: opts, now: opts.Now, seen: seen, raced: raced, stats: stats, lanes: newLanes(opts.MaxBatch),
		records: newRecords(api, opts.Table, keys, opts.ConfigCacheSize, opts.ConfigCacheTTL, opts.Now, stats),
	}
	b.records.along = b
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
		b.leases = backend.NewLeases(lease.Policy{Horizon: opts.LeaseHorizon.Milliseconds(), Share: opts.LeaseShare}, &stats.LeaseStats, less)
		b.bg.Go(func() { b.leases.Sweep(b.bg.SweepContext(), b.now, b.returnLease) })
	}
	return b, nil
}

// closeTimeout bounds how long Close waits for the writes in flight, and
// then how long it spends returning leases.
const closeTimeout = 5 * time.Second

// LeaseHorizon is the horizon leases are sized for; 0 when leases are off.
func (b *Backend) LeaseHorizon() time.Duration {
	if b.leases == nil {
		return 0
	}
	return b.opts.LeaseHorizon
}

// Stats returns the backend's running totals.
func (b *Backend) Stats() *Stats { return b.stats }

// Close gives every lease back to its bucket (within closeTimeout:
// what it cannot return is lost to the bucket until it refills, as in a
// crash) and ends the work running in the background. Decisions still
// under way when it is called may fail; the Backend must not be used
// after it. A second Close does nothing.
func (b *Backend) Close() error {
	if !b.bg.Close(closeTimeout) {
		return b.closeErr
	}
	if b.leases != nil {
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		b.leases.ReturnAll(ctx, b.leases.All(), b.returnLease)
		cancel()
		if left := b.stats.LeaseOutstanding.Load(); left > 0 {
			b.closeErr = fmt.Errorf("dynamodb backend: %d millitokens of leases could not be returned", left)
		}
	}
	b.records.close()
	return b.closeErr
}

// Ping reports whether the table answers.
func (b *Backend) Ping(ctx context.Context) error {
	_, err := b.api.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(b.table)})
	b.stats.call("DescribeTable", err)
	if err != nil {
		return fmt.Errorf("table %s: %w", b.table, err)
	}
	return nil
}

// target is one bucket a request is charged to, and the plan for it.
type target struct {
	key bucketKey
	res backend.Resolved
	fp  string // fingerprint of res.Limits: the cfg it must carry
	// refund: the request gives tokens back.
	refund bool
	// charged: some call of the write charges tokens already used
	// (backend.Request.Charge), which may leave a limit in debt;
	// admitted: some other call takes tokens. A write of charges alone
	// is conditioned only on leaving each limit at its floor or above.
	charged, admitted bool
	// forgiven is, per limit, what the limit's floor cut off the
	// write's charges: consumed, though it never left the bucket.
	forgiven []int64
	item     *bucketItem // last state seen; nil: absent or never seen
	// seenAt is when item was seen (epoch ms); 0 for never.
	seenAt int64
	// fresh: item was read from, or returned by, the table during this
	// decision, so a denial based on it is final.
	fresh bool
	// shared: other replicas were seen writing the bucket lately
	// (markShared).
	shared bool
	// overGuess is the item a wrong guess of this call's limits created
	// (seenItem.guessed), nil if none: planned over, it is a new bucket
	// under res, not one whose limits changed (plan).
	overGuess *bucketItem
	// lease is what this replica's lease on the bucket adds to the
	// decision, per res.Limits (nil: nothing): withdrawn to be folded
	// into the write, or, for a local denial, only looked at. grant is
	// what the write takes for the lease, per limit.
	lease []int64
	grant []int64
	// The report on the lease a write carries (reporting; leasePlan):
	// what the item counts out for it, what a renewal keeps of it (keep)
	// and, once planned, what the item still covers of that (kept), and
	// the window of its next lease; leaseW is the windows' width (0: no
	// leases, nothing expires). freed marks, per limit, the slots the
	// write frees.
	rep       backend.LeaseReport
	reporting bool
	keep      []int64
	kept      []int64
	newWin    int64
	leaseW    int64
	freed     [][bucket.LeaseSlots]bool
	// credit is, per limit, the refill the report's spent tokens are
	// owed (bucket.Return) by a bucket at its room since since;
	// lostBack, what the lease folded that no window covered.
	credit   []int64
	since    []int64
	lostBack []int64
	// lostRace: a write of this decision lost its race. Its retry
	// credits nothing from a time at its room that the item does not
	// keep: the proof of that time is the item's clock and room, which
	// every other writer moves, and a retry planned on them would lose
	// again for as long as others write, holding the report (and the
	// tokens it frees) back.
	lostRace bool

	mode   writeMode
	base   []bucket.State // states before the decision, per res.Limits
	states []bucket.State // states after it
}

type writeMode int

const (
	// create writes a new item over nothing (or an expired item).
	create writeMode = iota
	// rewrite replaces an item built from other limits (cfg mismatch).
	rewrite
	// incremental moves clocks and ADDs tokens: the steady state.
	incremental
	// unseen writes what create writes over an item this replica has
	// never seen: nothing there, or one of the same limits that is full
	// now (the same outcome either way), so that a first write made before
	// the item could be read does not lose its race to the replica that
	// made it, as a create would.
	unseen
)

// Decide implements backend.Backend.
//
// A call whose records are not cached yet (a key's first call on this
// replica) does not wait for them before it writes: its decision is made
// on the limits the records probably give (guess) while they are read, so
// that a key's first decision costs one round trip, not a read and then a
// write. Its answer stands only if the records confirm the guess; if not,
// it is decided again on what they say. The write made on a wrong guess
// took real tokens from the bucket (or put them in the lease) under
// limits that do not apply: the next write on the right limits reconciles
// the bucket as it does after any change of limits, so a wrong guess can
// only under-admit, by what that one write took.
func (b *Backend) Decide(ctx context.Context, req *backend.Request) (backend.Decision, error) {
	var buf [2]target
	set, pending := b.records.cache.Lookup(req.Entity, req.Resource)
	if set == nil {
		b.moving.Prefetch(ctx, req)
		if ts, level, ok := b.guess(req, buf[:0]); ok {
			return b.decideOnGuess(ctx, req, ts, level, pending)
		}
		var err error
		if set, err = pending.Wait(ctx); err != nil {
			return backend.Decision{}, err
		}
	}
	ts, level, err := b.targets(ctx, req, buf[:0], set)
	if err != nil {
		return backend.Decision{}, err
	}
	d, err := b.decideOn(ctx, req, ts, level, false)
	if !errors.Is(err, errLimitsChanged) {
		return d, err
	}
	// Another replica rewrote the bucket under other limits while this
	// call waited: resolved again (a share in force since, say), it
	// writes under those. Once: replicas that still disagree then write
	// as they would have.
	if ts, level, err = b.targets(ctx, req, buf[:0], set); err != nil {
		return backend.Decision{}, err
	}
	if d, err = b.decideOn(ctx, req, ts, level, false); errors.Is(err, errLimitsChanged) {
		err = fmt.Errorf("bucket %q/%q: %w", req.Entity, req.Resource, err)
	}
	return d, err
}

// decideOnGuess decides req on the guessed targets ts while pending reads
// its records, and answers once they confirm the guess; otherwise it
// decides again on theirs.
func (b *Backend) decideOnGuess(ctx context.Context, req *backend.Request, ts []target, level backend.Level, pending recordcache.Pending) (backend.Decision, error) {
	d, derr := b.decideOn(ctx, req, ts, level, true)
	rs, err := pending.Wait(ctx)
	if err != nil {
		return backend.Decision{}, err
	}
	var rbuf [2]target
	real, rlevel, err := b.targets(ctx, req, rbuf[:0], rs)
	if err != nil {
		return backend.Decision{}, err
	}
	if !errors.Is(derr, errUnsureGuess) && rlevel == level && sameTargets(real, ts) {
		b.stats.GuessesRight.Add(1)
		return d, derr
	}
	b.stats.GuessesWrong.Add(1)
	for i := range real {
		if s, ok := b.seen.Peek(real[i].key); ok && s.guessed {
			real[i].overGuess = s.item
		}
	}
	return b.decideOn(ctx, req, real, rlevel, false)
}

// errUnsureGuess stops a batch of guessed calls (Decide) that found the
// bucket under other limits: a write on the guess would rewrite the
// bucket to limits that may not apply, so the calls wait for their
// records instead.
var errUnsureGuess = errors.New("bucket holds other limits than guessed")

// guess returns the targets req probably has when its entity's records
// are not cached; ok is false when no guess is safe to make: a refund or
// a check (those answer from what is known), a parent named by the rule
// (a cascade writes two buckets), a bucket this replica has seen or holds
// a lease on (a key whose records merely expired: its limits are known
// from its item, and a wrong guess would fold its lease under them), a
// resource whose shared records have not been read lately, or a global
// key whose share follows its region's share record.
func (b *Backend) guess(req *backend.Request, ts []target) (_ []target, _ backend.Level, ok bool) {
	if req.Refund || req.Hits == 0 || req.Parent != "" || (req.Global && b.moving != nil) {
		return ts, backend.LevelNone, false
	}
	k := bucketKey{req.Entity, req.Resource}
	if b.seen.Contains(k) || (b.leases != nil && b.leases.Known(k)) {
		return ts, backend.LevelNone, false
	}
	set, ok := b.records.guess(req.Resource)
	if !ok {
		return ts, backend.LevelNone, false
	}
	// A Set never fails to resolve: it answers from memory.
	res, _ := backend.Resolve(context.Background(), set, req.Entity, req.Resource, req.Defaults)
	res = b.opts.Global.Apply(req.Global, res)
	if len(res.Limits) > 0 {
		ts = append(ts, target{key: k, res: res, fp: bucket.Fingerprint(res.Limits)})
	}
	return ts, res.Level, true
}

// sameTargets reports whether a and b charge the same buckets under the
// same limits, from the same kind of source.
func sameTargets(a, b []target) bool {
	return slices.EqualFunc(a, b, func(x, y target) bool {
		return x.key == y.key && x.fp == y.fp && x.res.Level == y.res.Level && x.res.Synced == y.res.Synced
	})
}

// decideOn decides req on the buckets ts, whose limits came from level
// (or were guessed to).
func (b *Backend) decideOn(ctx context.Context, req *backend.Request, ts []target, level backend.Level, guessed bool) (backend.Decision, error) {
	if len(ts) == 0 {
		return backend.NotLimited(), nil
	}
	began := b.now()
	// A check (no hits) on a leased bucket is answered here too, so that
	// its remaining count includes the lease like any other answer's.
	leased := b.leases != nil && !req.Refund && !req.Bulk
	if leased && req.Charge {
		b.leases.Charged(leasedAll(ts), began)
	}
	if leased {
		if d, ok := b.spend(ts, req, level, true); ok {
			return d, nil
		}
	}
	if d, ok := b.denyFromSeen(ts, req, level); ok {
		return d, nil
	}
	// A charge is never denied here, nor answered by the failure policy
	// for want of time: it waits for its write (ratelimit gives it a
	// deadline of its own), since what it counts was used already.
	charge := req.Charge && !req.Refund
	if leased && charge && req.Hits > 0 {
		// What the lease holds goes into the charge, the table gets
		// the rest: sent whole, it would leave the lease to pass checks
		// however deep in debt the bucket is.
		req = b.leases.Charging(leasedAll(ts), req, b.now())
	}
	if leased && req.Hits > 0 && !charge && b.beyondReach(ctx) {
		// No write can be back before this call's deadline: waiting for
		// one would only answer it late. It is answered now, and the
		// lease is renewed for the calls after it. Where the lease has
		// been spent and its next grant is on the way (this call starts
		// its renewal if none is under way yet), the lease is what
		// this replica may admit until that grant lands, as a quota
		// client's assignment is: the call is denied, as long as the
		// table answered lately (MaxDenyStaleness). The failure policy
		// is for the calls this replica knows too little about (a key's
		// first call on it, a lease left to expire, a table that has
		// stopped answering).
		b.loadSeen(ts)
		now := b.now()
		results, low, paid, outrun := b.leases.Beyond(leasedAll(ts), req.Hits, now, b.rtt.Ms(), func() { b.renewNow(ts) })
		if paid {
			return b.paid(ts, results, low, level), nil
		}
		if outrun && b.recentEnough(ts, now) {
			return b.deadlineDenial(ts, req, level), nil
		}
		return b.gaveUp(ts, req, level, began, fmt.Errorf("bucket %q/%q: %w", req.Entity, req.Resource, errBeyondReach))
	}
	if leased && req.Hits > 0 && !charge && b.opts.MaxDenyStaleness >= 0 {
		// This replica's last write left the bucket drained: the calls
		// its lease cannot pay are denied here while the next grant is
		// on its way (AtLimit, which starts it), instead of queueing for
		// the table.
		results, low, paid, denied := b.leases.AtLimit(leasedAll(ts), req.Hits, b.now(), b.rtt.Ms(), func() { b.renewNow(ts) })
		if paid {
			return b.paid(ts, results, low, level), nil
		}
		if denied {
			b.stats.LocalAnswers.Add(1)
			return b.denial(ts, req, level), nil
		}
	}
	keys := make([]bucketKey, len(ts))
	for i := range ts {
		keys[i] = ts[i].key
	}
	group := ""
	if len(ts) == 1 {
		group = ts[0].group()
	}
	c := newCall(ctx, req, group)
	c.guessed = guessed
	batch, err := b.lanes.enter(ctx, c, keys...)
	if err != nil {
		return b.gaveUp(ts, req, level, began, fmt.Errorf("waiting for bucket %q/%q: %w", req.Entity, req.Resource, err))
	}
	switch {
	case batch == nil: // answered by another call's batch
	case b.leases != nil && b.detach(ts, keys, batch):
		select {
		case <-c.wake:
		case <-ctx.Done():
			if c.abandon() {
				return b.gaveUp(ts, req, level, began, fmt.Errorf("writing bucket %q/%q: %w", req.Entity, req.Resource, ctx.Err()))
			}
			<-c.wake // answered just as ctx ended: the answer stands
		}
	case len(batch) == 1:
		defer b.lanes.leave(keys...)
		b.decideBatch(ctx, ts, batch)
	default:
		if err := b.lead(ctx, ts, keys, batch); err != nil {
			return backend.Decision{}, fmt.Errorf("writing bucket %q/%q: %w", req.Entity, req.Resource, err)
		}
	}
	if c.err != nil {
		if ctx.Err() != nil {
			return b.gaveUp(ts, req, level, began, c.err)
		}
		return backend.Decision{}, c.err
	}
	return decision(c, level), nil
}

// detach decides batch on a goroutine of its own, under a context of its
// own that outlives every caller's (backgroundTimeout, and Close): with
// leases, a write abandoned by its callers' deadlines still lands, and
// the tokens it took wait in the lease for the next calls. Without that,
// a table slower than the callers' deadlines would never be written, and
// the key would never warm. The lane stays held until the write is done,
// so a bucket has one such write in flight at most, whatever the
// traffic. It reports false, having done nothing, once Close has begun.
func (b *Backend) detach(ts []target, keys []bucketKey, batch []*call) bool {
	// The batch's own targets: its caller may stop waiting and go on
	// with its own.
	ts = slices.Clone(ts)
	return b.bg.Go(func() {
		defer b.lanes.leave(keys...)
		defer answer(batch)
		ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), backgroundTimeout)
		defer cancel()
		stop := context.AfterFunc(b.bg.Context(), cancel)
		defer stop()
		b.decideBatch(ctx, ts, batch)
	})
}

// errBeyondReach answers a call whose deadline is nearer than the
// table's measured round trip: as a deadline, for the failure policy.
var errBeyondReach = fmt.Errorf("the table's round trip is longer than the time left to the deadline: %w", context.DeadlineExceeded)

// beyondReach reports whether ctx ends sooner than a bucket write takes,
// as measured: a table farther away (or slower, for now) than the
// caller's deadline. Unknown before the first write.
func (b *Backend) beyondReach(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	rtt := b.rtt.Ms()
	return ok && rtt > 0 && time.Until(d) < time.Duration(rtt)*time.Millisecond
}

// renewNow starts a renewal of the lease on every bucket of ts that has
// none under way: calls that could not wait for a write of their own
// still fill the lease, through their demand, for the calls after them.
func (b *Backend) renewNow(ts []target) {
	for i := range ts {
		if lb := ts[i].leased(); b.leases.StartRenewal(&lb) {
			r := targetOf(lb)
			b.bg.Go(func() { b.background(b.bg.Context(), r, renewal) })
		}
	}
}

// gaveUp answers a call that came at began (ms) and stopped waiting for
// its bucket at its deadline (err). Where the bucket, as this replica
// last saw it (within MaxDenyStaleness), could not lease it a round trip
// of its demand (backend.Leases.Short), or this replica's last write
// before the call or while it waited left the bucket drained
// (backend.Leases.Drained), the answer is a denial: the replica is asked
// more than its part of the bucket, and an error would let Envoy's
// failure mode pass the call over a limit being reached. Anywhere else
// (a key far below its limit whose lease is still growing) it is err,
// for the failure policy.
func (b *Backend) gaveUp(ts []target, req *backend.Request, level backend.Level, began int64, err error) (backend.Decision, error) {
	if b.leases == nil || req.Refund || req.Hits == 0 {
		return backend.Decision{}, err
	}
	b.loadSeen(ts)
	now := b.now()
	if lbs, rtt := leasedAll(ts), b.rtt.Ms(); !b.recentEnough(ts, now) || !(b.leases.Short(lbs, now, rtt) || b.leases.Drained(lbs, now, rtt, now-began)) {
		return backend.Decision{}, err
	}
	return b.deadlineDenial(ts, req, level), nil
}

// deadlineDenial denies req, not yet decided by the table, at its
// deadline, and counts it (Stats.DeadlineDenials).
func (b *Backend) deadlineDenial(ts []target, req *backend.Request, level backend.Level) backend.Decision {
	b.stats.DeadlineDenials.Add(1)
	return b.denial(ts, req, level)
}

// denial denies req without the table's answer.
func (b *Backend) denial(ts []target, req *backend.Request, level backend.Level) backend.Decision {
	var limits []bucket.Limit
	for i := range ts {
		limits = append(limits, ts[i].res.Limits...)
	}
	c := call{req: req, limits: limits, results: make([]bucket.Result, len(limits))}
	for j, l := range limits {
		c.results[j] = bucket.Result{Cost: bucket.Cost(l, req.Hits)}
	}
	c.deny()
	return decision(&c, level)
}

// lead decides a batch of several calls, its own first, and returns when
// its own call is answered or ctx ends. The batch runs on a goroutine of
// its own because its DynamoDB calls live as long as any of its calls
// waits (batchContext): were the leader to run them, a hung table would
// hold its answer until the last follower's deadline, later than its own.
//
// A panic in the batch reaches the leader's caller as it would inline,
// when the leader still waits; if it has gone, the followers still get
// errAbandoned and the panic itself is dropped.
func (b *Backend) lead(ctx context.Context, ts []target, keys []bucketKey, batch []*call) error {
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }()
		defer b.lanes.leave(keys...)
		defer answer(batch)
		ctx, cancel := batchContext(batch)
		defer cancel()
		b.decideBatch(ctx, ts, batch)
	}()
	select {
	case p := <-done:
		if p != nil {
			panic(p)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// asked reports whether the table has answered for any of ts during this
// decision (a read, or a write's returned item): an answer given after
// that is not local.
func asked(ts []target) bool {
	for i := range ts {
		if ts[i].fresh {
			return true
		}
	}
	return false
}

// decision is c's answer, on the limits it was decided with.
func decision(c *call, level backend.Level) backend.Decision {
	return backend.Decision{Allowed: c.allowed, Limits: c.limits, Results: c.results,
		Binding: bucket.Binding(c.limits, c.results), Level: level}
}

// denyFromSeen answers a denial at once from the last state this replica
// saw of every bucket, when that state is recent enough to deny from and
// cannot pay for req, without queueing behind a write in flight for the
// bucket: a flood of requests over their limit then costs neither a call
// nor a wait. Anything else (it would pass, or the state is too old) goes
// through the bucket's lane.
func (b *Backend) denyFromSeen(ts []target, req *backend.Request, level backend.Level) (backend.Decision, bool) {
	if req.Refund || req.Hits == 0 || req.Charge {
		return backend.Decision{}, false
	}
	b.loadSeen(ts)
	now := b.now()
	if !b.recentEnough(ts, now) { // never seen counts as too old
		return backend.Decision{}, false
	}
	if b.leases != nil {
		for i := range ts {
			lb := ts[i].leased()
			ts[i].lease = b.leases.Peek(&lb)
		}
	}
	c := call{req: req}
	calls := [1]*call{&c}
	if decideCalls(ts, calls[:], now); c.allowed {
		return backend.Decision{}, false
	}
	b.stats.LocalAnswers.Add(1)
	return decision(&c, level), true
}

// loadSeen starts every target from the last state this replica saw of
// its bucket (none: item nil, seenAt 0), not yet confirmed by the table.
func (b *Backend) loadSeen(ts []target) {
	for i := range ts {
		seen, _ := b.seen.Get(ts[i].key)
		ts[i].item, ts[i].seenAt, ts[i].fresh = seen.item, seen.at, false
		if seen.guessed {
			// Any call on it, not only the guessed one decided again,
			// plans on such an item as new (target.plan): reconciled,
			// the guess's lease, out under the guessed burst, would
			// leave no room under the real one.
			ts[i].overGuess = seen.item
		}
	}
}

// markShared marks the targets whose buckets other replicas have been
// seen writing lately (leases on only: the sign comes from the leases'
// bookkeeping). A copy of such an item that looks
// expired has probably been kept alive by them since this replica saw
// it, so its write is planned on the item rather than as a new one:
// either guess costs one lost race when wrong, and this one is right far
// more often on a bucket several replicas use.
func (b *Backend) markShared(ts []target) {
	if b.leases == nil {
		return
	}
	now := b.now()
	for i := range ts {
		// Others' writes keep it alive for a TTL after each; a bucket
		// seen shared within two horizons (how long a lease's
		// bookkeeping is remembered) probably still is.
		ttl, ok := backend.BucketTTL(ts[i].res, b.opts.TTLMultiplier)
		ts[i].shared = ok && b.leases.SharedSince(ts[i].key, now-max(ttl, 2*b.leases.Horizon()))
	}
}

// targets resolves the buckets req is charged to, appended to ts: the
// entity's, then its parent's when there is one, leaving out a bucket no
// level gives any limit. level is where the entity's limits came from.
// first is the entity's records, already read.
func (b *Backend) targets(ctx context.Context, req *backend.Request, ts []target, first *recordcache.Set) ([]target, backend.Level, error) {
	level := backend.LevelNone
	// The parent comes from the rule's parent template, else from the
	// entity's META item when it asks for cascade.
	parent := req.Parent
	for i, entity := range [2]string{req.Entity, ""} {
		if i == 1 {
			entity = parent
		}
		if entity == "" || (i == 1 && entity == req.Entity) {
			continue
		}
		rs := first
		if i == 1 {
			var err error
			if rs, err = b.records.get(ctx, entity, req.Resource); err != nil {
				return nil, level, err
			}
		}
		if i == 0 && parent == "" {
			parent = rs.Parent
		}
		res, err := backend.Resolve(ctx, rs, entity, req.Resource, req.Defaults)
		if err != nil {
			return nil, level, err
		}
		if res, err = b.opts.Global.Enforce(ctx, req, entity, res, b.moving); err != nil {
			return nil, level, err
		}
		if i == 0 {
			level = res.Level
		}
		if len(res.Limits) > 0 {
			ts = append(ts, target{key: bucketKey{entity, req.Resource}, res: res,
				fp: bucket.Fingerprint(res.Limits)})
		}
	}
	return ts, level, nil
}

// group names the calls that may share t's writes: those whose limits
// resolved to the same list from the same kind of source, so that one
// write (its condition, its TTL) is right for all of them. Sharing off,
// it is "".
func (t *target) group() string {
	synced := "n"
	if t.res.Synced {
		synced = "s"
	}
	return t.fp + "|" + strconv.Itoa(int(t.res.Level)) + synced
}

// recentEnough reports whether every target's view may decide a denial:
// read during this decision, or seen at most MaxDenyStaleness ago.
func (b *Backend) recentEnough(ts []target, now int64) bool {
	always := b.opts.MaxDenyStaleness < 0 // any negative duration, -1ns included
	limit := b.opts.MaxDenyStaleness.Milliseconds()
	for i := range ts {
		t := &ts[i]
		if !t.fresh && (always || t.seenAt == 0 || now-t.seenAt > limit) {
			return false
		}
	}
	return true
}

// refresh reads every target's item with a strongly consistent read.
func (b *Backend) refresh(ctx context.Context, ts []target) error {
	for i := range ts {
		out, err := b.api.GetItem(ctx, &dynamodb.GetItemInput{
			TableName:              aws.String(b.table),
			Key:                    b.itemKey(ts[i].key),
			ConsistentRead:         aws.Bool(true),
			ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
		})
		b.stats.call("GetItem", err)
		if err != nil {
			return fmt.Errorf("reading bucket %q/%q: %w", ts[i].key.entity, ts[i].key.resource, err)
		}
		b.stats.consumedRead(out.ConsumedCapacity)
		if err := b.saw(&ts[i], out.Item); err != nil {
			return err
		}
	}
	return nil
}

// saw records an item state the table returned for t.
func (b *Backend) saw(t *target, av map[string]types.AttributeValue) error {
	it, err := decodeBucket(av)
	if err != nil {
		return fmt.Errorf("bucket %q/%q: %w", t.key.entity, t.key.resource, err)
	}
	t.item, t.fresh = it, true
	b.seen.Add(t.key, seenItem{item: it, at: b.now()})
	return nil
}

func (b *Backend) unseen(k bucketKey) bool { return !b.seen.Contains(k) }

func (b *Backend) readAlong(k bucketKey, av map[string]types.AttributeValue) {
	if it, err := decodeBucket(av); err == nil {
		b.seen.ContainsOrAdd(k, seenItem{item: it, at: b.now()})
	}
}

func (b *Backend) itemKey(k bucketKey) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		attrPK: str(b.keys.EntityPK(k.entity)),
		attrSK: str(b.keys.BucketSK(k.resource)),
	}
}

// ttlSeconds is the ttl attribute a bucket written now gets, by ADR-119
// and ADR-128, or 0 for none.
func (b *Backend) ttlSeconds(res backend.Resolved, now int64) int64 {
	ttl, ok := backend.BucketTTL(res, b.opts.TTLMultiplier)
	if !ok {
		return 0
	}
	const far = int64(1) << 50 // ~35,000 years in ms: "never", without overflow
	return ceilSeconds(now + min(ttl, far))
}

// errLostRace reports a write whose condition failed because another
// writer got there first; the targets then hold the state the table
// returned, and the decision is recomputed.
type errLostRace struct{ cause error }

func (e errLostRace) Error() string { return "lost a write race: " + e.cause.Error() }
func (e errLostRace) Unwrap() error { return e.cause }
