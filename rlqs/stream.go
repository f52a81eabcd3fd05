package rlqs

import (
	"context"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/backend"
)

// maxReportCount is the most requests one report may say a bucket
// allowed or denied: a billion in a reporting interval is beyond any
// Envoy, and a count past it is refused rather than charged.
const maxReportCount = 1_000_000_000

// streamState is one stream's buckets, owned by its handler's loop.
type streamState struct {
	svc    *Service
	domain string
	// fingerprint is the config the slots were matched under: a reload
	// matches every bucket again at its next renewal.
	fingerprint string
	slots       map[string]*slot
	ids         map[string]*rlqsv3.BucketId
}

// report takes one message of the stream in. The first must name the
// domain; a later one naming another is an error (Envoy opens a new
// stream to change domains). Bad usages are refused one by one.
func (st *streamState) report(m *rlqsv3.RateLimitQuotaUsageReports) error {
	svc := st.svc
	switch d := m.GetDomain(); {
	case st.domain == "" && d == "":
		return status.Error(codes.InvalidArgument, "the first usage report of a stream must name its domain")
	case st.domain == "":
		if len(d) > svc.opts.MaxKeyLen {
			return status.Errorf(codes.InvalidArgument, "domain is %d bytes, over the limit of %d", len(d), svc.opts.MaxKeyLen)
		}
		st.domain = d
		if !svc.rules.Current().HasDomain(d) {
			svc.logf(context.Background(), "domain", "quota stream for a domain no rule file defines: its buckets are not limited", slog.String("domain", d))
		}
	case d != "" && d != st.domain:
		return status.Errorf(codes.InvalidArgument, "the stream's domain is %q; a report named %q", st.domain, d)
	}
	now := svc.opts.Now()
	for _, u := range m.GetBucketQuotaUsages() {
		if err := st.usage(u, now); err != "" {
			svc.stats.refused.Add(1)
			svc.logf(context.Background(), "refused", "quota usage report refused", slog.String("domain", st.domain), slog.String("reason", err))
		}
	}
	return nil
}

// usage takes one bucket's usage in; it returns why it refused it, ""
// when it did not.
func (st *streamState) usage(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, now int64) string {
	o := &st.svc.opts
	id := u.GetBucketId().GetBucket()
	switch {
	case len(id) == 0:
		return "empty bucket id"
	case len(id) > o.MaxKeys:
		return "bucket id has too many keys"
	}
	for k, v := range id {
		if k == "" || len(k) > o.MaxKeyLen || len(v) > o.MaxValueLen {
			return "bucket id key or value empty or too long"
		}
	}
	allowed, denied := u.GetNumRequestsAllowed(), u.GetNumRequestsDenied()
	if allowed > maxReportCount || denied > maxReportCount {
		return "absurd request count"
	}
	elapsed := u.GetTimeElapsed().AsDuration()
	if elapsed < 0 {
		return "negative time elapsed"
	}
	key := idKey(id)
	s := st.slots[key]
	if s == nil && allowed+denied == 0 {
		// A bucket's first report carries its first request. One with
		// none is Envoy's periodic report of a bucket this replica has
		// just abandoned, sent before the abandon arrived: Envoy no
		// longer holds it.
		return ""
	}
	if s == nil {
		if len(st.slots) >= o.MaxBuckets {
			return "stream has too many buckets"
		}
		s = &slot{demand: -1, due: now}
		st.slots[key] = s
		if st.ids == nil {
			st.ids = map[string]*rlqsv3.BucketId{}
		}
		st.ids[key] = &rlqsv3.BucketId{Bucket: maps.Clone(id)}
		st.match(s, id)
		if s.matched {
			st.svc.arrive(sharedKey(s.req), now)
		}
		st.svc.stats.buckets.Add(1)
	}
	if elapsed >= time.Second {
		// Envoy's time_elapsed is whole seconds, cut short: 4.9 s of
		// requests may come as 4 s. The time since this replica heard
		// the bucket's last report is the better measure when there was
		// one (the first report of a bucket, with its first request,
		// says nothing of a rate).
		span := elapsed.Seconds()
		if local := float64(now-s.seen) / 1000; s.seen > 0 && local >= span {
			span = local
		}
		s.demand = float64(allowed+denied) / span
	}
	s.seen = now
	if allowed+denied > 0 || s.busy == 0 {
		s.busy = now
	}
	s.allowed += allowed
	s.reclaim(now, o.Policy.Allowance.Milliseconds())
	if a := s.active; a != nil && !a.Allow && denied > 0 && float64(a.PerSecond) < s.demand && now-s.early >= 1000 {
		// Denials beyond what its assignment gives: renew now, not at
		// its end, so a rise in demand is served within a report.
		s.early, s.due = now, now
	}
	return ""
}

// match maps id onto the rule files in force.
func (st *streamState) match(s *slot, id map[string]string) {
	cfg := st.svc.rules.Current()
	st.fingerprint = cfg.Fingerprint()
	m, _, ok := cfg.MatchBucketID(st.domain, id)
	s.matched = ok && m.Rule != nil && !m.Rule.Unlimited && !m.Rule.ShadowMode
	s.limits = false
	if s.matched {
		// Bulk: an Envoy paces what its assignment admits, so its takes
		// go straight to the shared bucket, not through the leases kept
		// for ShouldRateLimit's calls.
		s.req = backend.Request{Entity: m.Entity, Resource: m.Resource, Parent: m.Parent,
			Defaults: m.Rule.Limits, Global: m.Rule.Global, Bulk: true}
	}
}

// due renews every assignment due at now, abandons the buckets idle for
// longer than the policy allows, and returns the actions to send.
func (st *streamState) due(ctx context.Context) *rlqsv3.RateLimitQuotaResponse {
	svc := st.svc
	now := svc.opts.Now()
	if fp := svc.rules.Current().Fingerprint(); fp != st.fingerprint {
		for k, s := range st.slots {
			st.match(s, st.ids[k].GetBucket())
		}
	}
	resp := &rlqsv3.RateLimitQuotaResponse{}
	var keys []string
	for k, s := range st.slots {
		switch {
		case now-s.busy > svc.opts.Policy.Idle.Milliseconds():
			svc.stats.stranded.Add(s.outstanding(now))
			svc.stats.abandon.Add(1)
			svc.stats.buckets.Add(-1)
			resp.BucketAction = append(resp.BucketAction, &rlqsv3.RateLimitQuotaResponse_BucketAction{
				BucketId:     st.ids[k],
				BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
			})
			delete(st.slots, k)
			delete(st.ids, k)
		case s.due <= now:
			keys = append(keys, k)
		}
	}
	slices.Sort(keys) // the same order each time: no bucket always last
	actions := make([]*rlqsv3.RateLimitQuotaResponse_BucketAction, len(keys))
	var wg sync.WaitGroup
	sem := make(chan struct{}, svc.opts.Workers)
	for i, k := range keys {
		s := st.slots[k]
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			key := sharedKey(s.req)
			r, err := svc.opts.Policy.renew(ctx, svc.be, s, now, svc.peersOf(key, s, now))
			if s.short {
				svc.pressure.Add(key, now)
			}
			svc.stats.leased.Add(r.taken)
			svc.stats.returned.Add(r.returned)
			if err != nil {
				svc.stats.backendErrors.Add(1)
				svc.logf(ctx, "backend", "renewing a quota assignment failed; retrying", slog.String("domain", st.domain), slog.String("error", err.Error()))
				s.due = now + 1000
				return
			}
			svc.ahead.book(key, s, s.due, s.asked)
			if r.wait {
				return
			}
			actions[i] = svc.action(st.ids[k], r)
		}()
	}
	wg.Wait()
	for _, a := range actions {
		if a != nil {
			resp.BucketAction = append(resp.BucketAction, a)
		}
	}
	return resp
}

// next is when (ms) the earliest renewal of the stream's buckets is
// due; far ahead when it has none.
func (st *streamState) next() int64 {
	next := int64(math.MaxInt64)
	for _, s := range st.slots {
		next = min(next, s.due)
	}
	return next
}

// action is the assignment r for the bucket id, as Envoy reads it.
func (svc *Service) action(id *rlqsv3.BucketId, r renewal) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	strategy := &typev3.RateLimitStrategy{}
	switch {
	case r.Allow:
		svc.stats.allowAll.Add(1)
		strategy.Strategy = &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}
	case r.Deny():
		svc.stats.denyAll.Add(1)
		strategy.Strategy = &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}
	default:
		svc.stats.tokenBuckets.Add(1)
		strategy.Strategy = &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens:     uint32(min(r.MaxTokens, math.MaxUint32)),
			TokensPerFill: wrapperspb.UInt32(uint32(min(r.PerSecond, math.MaxUint32))),
			FillInterval:  durationpb.New(1e9),
		}}
	}
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(r.ttl),
				RateLimitStrategy:    strategy,
			},
		},
	}
}

// end counts what the stream's buckets held as stranded.
func (st *streamState) end() {
	now := st.svc.opts.Now()
	for _, s := range st.slots {
		st.svc.stats.stranded.Add(s.outstanding(now))
	}
	st.svc.stats.buckets.Add(-int64(len(st.slots)))
}

// idKey is a canonical string for a BucketId: its pairs in key order,
// each part's length first, so no two ids share one.
func idKey(id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(strconv.Itoa(len(k)))
		b.WriteByte(':')
		b.WriteString(k)
		b.WriteString(strconv.Itoa(len(id[k])))
		b.WriteByte(':')
		b.WriteString(id[k])
	}
	return b.String()
}
