// Package rlqstest drives a quota server as Envoy's rate_limit_quota
// HTTP filter does: Filter sorts requests into buckets, enforces the
// assignments the server streams to it, and reports each bucket's
// allowed and denied counts on one stream. It behaves as the filter's
// global client on Envoy's main branch does (global_client_impl.cc at
// commit c33e7f8, 2026), as docs/rlqs.md describes; it is written from
// that behaviour, not from its code:
//
//   - a bucket's first request is reported at once (one request, zero
//     time elapsed); every bucket is then reported each reporting
//     interval, on one timer started by the first bucket, with the time
//     since its last report cut to whole seconds;
//   - a token bucket assignment refills continuously at tokens_per_fill
//     over fill_interval in whole seconds (under a second: no limit);
//     one equal to the bucket in force (max_tokens, tokens_per_fill and
//     the fill interval's nanoseconds) keeps its tokens, another starts
//     as full, in proportion, as the one it replaces, or full;
//   - an assignment expires its TTL's whole seconds after it arrives;
//     the bucket then follows the expired behaviour, then the
//     no-assignment one; an abandon action forgets the bucket.
package rlqstest

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Behavior is what the filter does with a bucket that has no assignment
// in force (before its first, or once one expired): admit everything or
// nothing.
type Behavior int

const (
	// AllowAll admits every request: Envoy's default when the filter's
	// bucket settings name no behaviour.
	AllowAll Behavior = iota
	// DenyAll denies every request.
	DenyAll
)

// Options configure a Filter.
type Options struct {
	Domain string
	// ReportInterval is how often every bucket is reported (5 s: Envoy's
	// filter uses one 5 s timer, whatever the bucket settings'
	// reporting_interval says).
	ReportInterval time.Duration
	// NoAssignment applies before a bucket's first assignment; Expired
	// after one expired (the expired_assignment_behavior fallback; Envoy
	// falls back to NoAssignment when it is not set).
	NoAssignment, Expired Behavior
	// OnAssignment, when set, hears every action received.
	OnAssignment func(Action)
}

// Action is one bucket action as the filter applied it.
type Action struct {
	ID      map[string]string
	Abandon bool
	// For an assignment: the blanket rule, or the token bucket (MaxTokens,
	// PerFill tokens each Fill), and its TTL (zero: none).
	Allow, Deny        bool
	MaxTokens, PerFill uint64
	Fill, TTL          time.Duration
}

// Filter is one Envoy's rate_limit_quota filter and its stream. Safe for
// concurrent use.
type Filter struct {
	opts Options
	now  func() time.Time
	// life ends with Close: the reporting timer runs until then, across
	// streams.
	life  context.Context
	end   context.CancelFunc
	timer sync.Once // the reporting timer starts with the first bucket

	mu      sync.Mutex
	buckets map[string]*fbucket
	denials Denials

	sendMu   sync.Mutex // guards the stream fields; one report at a time
	stream   grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	cancel   context.CancelFunc // the stream's
	done     chan struct{}      // closed when the stream's receiver stops
	err      error              // why it stopped
	sentOnce bool
}

// fbucket is one bucket of the filter's cache.
type fbucket struct {
	id               map[string]string
	allowed, denied  uint64 // since the last report
	lastReport       time.Time
	assigned         bool
	expires          time.Time
	allow, deny      bool
	tokens, max      float64
	rate             float64 // tokens a second
	refilledAt       time.Time
	perFill          uint64
	fill             time.Duration
	totalA, totalDen uint64
}

// Dial opens a stream on conn and starts reporting. Close ends it.
func Dial(ctx context.Context, conn grpc.ClientConnInterface, opts Options) (*Filter, error) {
	if opts.ReportInterval <= 0 {
		opts.ReportInterval = 5 * time.Second
	}
	life, end := context.WithCancel(ctx)
	f := &Filter{opts: opts, now: time.Now, life: life, end: end, buckets: map[string]*fbucket{}}
	if err := f.open(conn); err != nil {
		end()
		return nil, err
	}
	return f, nil
}

// open starts a stream on conn and its receiver.
func (f *Filter) open(conn grpc.ClientConnInterface) error {
	ctx, cancel := context.WithCancel(f.life)
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		return err
	}
	done := make(chan struct{})
	f.sendMu.Lock()
	f.stream, f.cancel, f.done, f.err, f.sentOnce = stream, cancel, done, nil, false
	f.sendMu.Unlock()
	go f.receive(stream, done)
	return nil
}

// Reconnect ends the stream and opens another on conn, as Envoy does
// when its stream breaks: the buckets and their assignments stay, and
// the next periodic report names them all on the new stream.
func (f *Filter) Reconnect(conn grpc.ClientConnInterface) error {
	f.stop()
	return f.open(conn)
}

// stop ends the stream and waits for its receiver.
func (f *Filter) stop() {
	f.sendMu.Lock()
	cancel, done := f.cancel, f.done
	f.sendMu.Unlock()
	cancel()
	<-done
}

// Close ends the stream and the filter.
func (f *Filter) Close() error {
	f.end()
	f.stop()
	return nil
}

// Err is why the stream ended, nil while it runs or after Close.
func (f *Filter) Err() error {
	f.sendMu.Lock()
	done := f.done
	f.sendMu.Unlock()
	select {
	case <-done:
		f.sendMu.Lock()
		defer f.sendMu.Unlock()
		if errors.Is(f.err, context.Canceled) || status.Code(f.err) == codes.Canceled {
			return nil
		}
		return f.err
	default:
		return nil
	}
}

func key(id map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(id)) {
		b.WriteString(k + "\x00" + id[k] + "\x00")
	}
	return b.String()
}

// Request sorts one request into the bucket id and says whether the
// filter admits it. A bucket's first request is reported at once.
func (f *Filter) Request(id map[string]string) bool {
	now := f.now()
	k := key(id)
	f.mu.Lock()
	b := f.buckets[k]
	first := b == nil
	if first {
		b = &fbucket{id: maps.Clone(id), lastReport: now}
		f.buckets[k] = b
	}
	ok := b.admit(now, f.opts, &f.denials)
	if ok {
		b.allowed++
		b.totalA++
	} else {
		b.denied++
		b.totalDen++
	}
	var first1 *rlqsv3.RateLimitQuotaUsageReports
	if first {
		first1 = f.reportOf([]*fbucket{b}, now)
	}
	f.mu.Unlock()
	if first1 != nil {
		f.timer.Do(func() { go f.reportEvery() })
		f.send(first1)
	}
	return ok
}

// Denials counts a filter's denials by their cause.
type Denials struct {
	// Unassigned: no assignment yet, under the NoAssignment behaviour.
	Unassigned uint64
	// Expired: the assignment's TTL ran out, under the Expired behaviour.
	Expired uint64
	// DenyAll: a DENY_ALL assignment in force.
	DenyAll uint64
	// Empty: a token bucket in force had no token left.
	Empty uint64
}

// Denials returns the filter's denials since it was dialed, by cause.
func (f *Filter) Denials() Denials {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.denials
}

// admit applies the bucket's assignment, or the behaviour for none, and
// counts a denial in d under its cause.
func (b *fbucket) admit(now time.Time, o Options, d *Denials) bool {
	verdict := func(ok bool, cause *uint64) bool {
		if !ok {
			*cause++
		}
		return ok
	}
	switch {
	case !b.assigned:
		return verdict(o.NoAssignment == AllowAll, &d.Unassigned)
	case !now.Before(b.expires):
		return verdict(o.Expired == AllowAll, &d.Expired)
	case b.allow:
		return true
	case b.deny:
		return verdict(false, &d.DenyAll)
	}
	b.refill(now)
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return verdict(false, &d.Empty)
}

// refill adds what the bucket's rate made since it was last refilled.
func (b *fbucket) refill(now time.Time) {
	b.tokens = min(b.max, b.tokens+b.rate*now.Sub(b.refilledAt).Seconds())
	b.refilledAt = now
}

// Totals returns what the filter admitted and denied in id's bucket since
// it was first seen.
func (f *Filter) Totals(id map[string]string) (allowed, denied uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b := f.buckets[key(id)]; b != nil {
		return b.totalA, b.totalDen
	}
	return 0, 0
}

// reportOf builds the usage report of bs at now and resets their counts.
// f.mu is held.
func (f *Filter) reportOf(bs []*fbucket, now time.Time) *rlqsv3.RateLimitQuotaUsageReports {
	m := &rlqsv3.RateLimitQuotaUsageReports{}
	for _, b := range bs {
		elapsed := now.Sub(b.lastReport).Truncate(time.Second)
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: maps.Clone(b.id)},
			TimeElapsed:        durationpb.New(elapsed),
			NumRequestsAllowed: b.allowed,
			NumRequestsDenied:  b.denied,
		})
		b.allowed, b.denied, b.lastReport = 0, 0, now
	}
	return m
}

// send sends m, naming the domain on the stream's first message.
func (f *Filter) send(m *rlqsv3.RateLimitQuotaUsageReports) {
	f.sendMu.Lock()
	defer f.sendMu.Unlock()
	if !f.sentOnce {
		m.Domain = f.opts.Domain
		f.sentOnce = true
	}
	_ = f.stream.Send(m) // a broken stream ends receive, which records why
}

// reportEvery reports every bucket of the cache each interval, on
// whatever stream is open, until Close.
func (f *Filter) reportEvery() {
	t := time.NewTicker(f.opts.ReportInterval)
	defer t.Stop()
	for {
		select {
		case <-f.life.Done():
			return
		case <-t.C:
		}
		now := f.now()
		f.mu.Lock()
		bs := slices.Collect(maps.Values(f.buckets))
		var m *rlqsv3.RateLimitQuotaUsageReports
		if len(bs) > 0 {
			m = f.reportOf(bs, now)
		}
		f.mu.Unlock()
		if m != nil {
			f.send(m)
		}
	}
}

// receive applies the actions that come on stream until it ends.
func (f *Filter) receive(stream grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse], done chan struct{}) {
	defer close(done)
	for {
		resp, err := stream.Recv()
		if err != nil {
			f.sendMu.Lock()
			if f.done == done {
				f.err = err
			}
			f.sendMu.Unlock()
			return
		}
		now := f.now()
		for _, a := range resp.GetBucketAction() {
			f.apply(a, now)
		}
	}
}

// apply applies one action: an assignment whose strategy equals the one
// in force (and not expired) only lengthens it, keeping its tokens;
// another replaces it with a full bucket; abandon forgets the bucket.
func (f *Filter) apply(a *rlqsv3.RateLimitQuotaResponse_BucketAction, now time.Time) {
	id := a.GetBucketId().GetBucket()
	act := Action{ID: id}
	f.mu.Lock()
	defer func() {
		f.mu.Unlock()
		if f.opts.OnAssignment != nil {
			f.opts.OnAssignment(act)
		}
	}()
	k := key(id)
	if a.GetAbandonAction() != nil {
		act.Abandon = true
		delete(f.buckets, k)
		return
	}
	b := f.buckets[k]
	if b == nil {
		return // not in the cache: Envoy ignores it
	}
	qa := a.GetQuotaAssignmentAction()
	s := qa.GetRateLimitStrategy()
	if ttl := qa.GetAssignmentTimeToLive(); ttl != nil {
		act.TTL = ttl.AsDuration()
	}
	switch {
	case s.GetTokenBucket() != nil:
		tb := s.GetTokenBucket()
		act.MaxTokens, act.PerFill, act.Fill = uint64(tb.GetMaxTokens()), uint64(tb.GetTokensPerFill().GetValue()), tb.GetFillInterval().AsDuration()
	case s.GetBlanketRule() == 1:
		act.Deny = true
	default:
		act.Allow = true
	}
	wasBucket := b.assigned && !b.allow && !b.deny && now.Before(b.expires)
	tokenBucket := !act.Allow && !act.Deny
	same := wasBucket && tokenBucket && uint64(b.max) == act.MaxTokens && b.perFill == act.PerFill &&
		b.fill.Nanoseconds()%1e9 == act.Fill.Nanoseconds()%1e9
	if !same {
		start := float64(act.MaxTokens)
		if wasBucket && b.max > 0 {
			b.refill(now)
			start *= b.tokens / b.max
		}
		b.allow, b.deny = act.Allow, act.Deny
		b.max, b.tokens, b.refilledAt = float64(act.MaxTokens), start, now
		b.perFill, b.fill = act.PerFill, act.Fill
		b.rate = 0
		if whole := act.Fill.Truncate(time.Second); whole >= time.Second {
			b.rate = float64(act.PerFill) / whole.Seconds()
		} else if tokenBucket {
			b.allow = true // a fill interval under a second: no limit
		}
	}
	b.assigned = true
	// The TTL's whole seconds from now; none (or zero) expires at once.
	b.expires = now.Add(act.TTL.Truncate(time.Second))
}
