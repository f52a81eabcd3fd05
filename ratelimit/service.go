// Package ratelimit is Sluice's gRPC face: it serves Envoy's
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit. For each
// request it validates the input, asks the mapping config which rule and
// bucket each descriptor maps to, asks the backend to decide, and builds
// the answer Envoy expects (DESIGN section 5): one status per descriptor,
// the binding limit, what remains, when it resets, and the overall code,
// with shadow mode and the failure policy applied.
package ratelimit

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/descriptors"
)

// Rules gives the mapping config in force; a hot reload swaps it.
type Rules interface {
	Current() *descriptors.Config
}

// Options configure a Service. The zero Options is usable.
type Options struct {
	// ShadowMode answers OK to everything while still deciding and
	// counting, for every rule (rules can also opt in one by one).
	ShadowMode bool
	// QuotaMode puts every limited descriptor in quota mode, as each rule
	// with quota_mode is: see quotaTally.
	QuotaMode bool
	// QuotaGroupKeys makes the quota-mode descriptors that carry the same
	// values of these entry keys one quota, spent when any of them is
	// over (Envoy AI Gateway: backend_name and model_name_override). Nil:
	// each is a quota of its own, as in envoyproxy/ratelimit. See
	// quotaTally.
	QuotaGroupKeys []string
	// DynamicMetadata adds the response's dynamic_metadata, as
	// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA does: see
	// dynamicMetadata.
	DynamicMetadata bool
	// OnBackendError is the failure policy.
	OnBackendError FailurePolicy
	// ResponseHeaders adds RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset (the most constraining descriptor), and the IETF
	// fields RateLimit-Policy and RateLimit (every named limit, the ones
	// that denied first), to the response Envoy sends downstream.
	ResponseHeaders bool
	// Input bounds the size of a request; zero fields take defaults.
	Input InputLimits
	// Logger receives failure-policy activations, at most one line per
	// FailureLogInterval (5 s) with a count of those left out, so a dead
	// backend cannot flood the logs. Nil discards them.
	Logger             *slog.Logger
	FailureLogInterval time.Duration
	// Observer hears every decision and call (metrics, traces); nil is
	// none.
	Observer Observer
	// NearLimitRatio is the share of a limit's burst used beyond which
	// an allowed descriptor counts as near its limit (0.8).
	NearLimitRatio float64
	// NoDeadlineTimeout bounds the backend's work for a call that carries
	// no deadline (Envoy always sends one; grpcurl need not): 1 s when
	// zero. Without it, a hung backend would pin such calls forever.
	NoDeadlineTimeout time.Duration
}

// Service implements rlsv3.RateLimitServiceServer. It is safe for
// concurrent use; create it with New.
type Service struct {
	rules   Rules
	backend backend.Backend
	opts    Options
	stats   counters
	failLog logLimiter
	// charging holds a place for each charge written past its caller's
	// deadline (decideCharge).
	charging chan struct{}
}

// New returns a Service deciding rules' descriptors with be.
func New(rules Rules, be backend.Backend, opts Options) *Service {
	opts.Input = opts.Input.withDefaults()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.FailureLogInterval <= 0 {
		opts.FailureLogInterval = 5 * time.Second
	}
	if opts.Observer == nil {
		opts.Observer = nopObserver{}
	}
	if opts.NearLimitRatio <= 0 || opts.NearLimitRatio > 1 {
		opts.NearLimitRatio = 0.8
	}
	if opts.NoDeadlineTimeout <= 0 {
		opts.NoDeadlineTimeout = time.Second
	}
	return &Service{rules: rules, backend: be, opts: opts, failLog: logLimiter{every: opts.FailureLogInterval},
		charging: make(chan struct{}, maxDetachedCharges)}
}

// Stats are running totals since start.
type Stats struct {
	Requests        uint64 `json:"requests"`
	InvalidRequests uint64 `json:"invalid_requests"`
	OK              uint64 `json:"descriptors_ok"`
	OverLimit       uint64 `json:"descriptors_over_limit"`
	ShadowOverLimit uint64 `json:"descriptors_shadow_over_limit"`
	BackendErrors   uint64 `json:"backend_errors"`
}

type counters struct {
	requests, invalid, ok, over, shadow, backendErrors atomic.Uint64
}

// Stats returns the running totals.
func (s *Service) Stats() Stats {
	return Stats{
		Requests: s.stats.requests.Load(), InvalidRequests: s.stats.invalid.Load(),
		OK: s.stats.ok.Load(), OverLimit: s.stats.over.Load(), ShadowOverLimit: s.stats.shadow.Load(),
		BackendErrors: s.stats.backendErrors.Load(),
	}
}

// ShouldRateLimit implements rlsv3.RateLimitServiceServer.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	cfg := s.rules.Current()
	known := cfg.HasDomain(req.GetDomain())
	resp, err := s.shouldRateLimit(ctx, cfg, known, req)
	a := Answered{Domain: req.GetDomain(), KnownDomain: known,
		Code: status.Code(err), Duration: time.Since(start)}
	if resp != nil {
		a.Overall = resp.OverallCode
	}
	s.opts.Observer.Answered(ctx, a)
	return resp, err
}

func (s *Service) shouldRateLimit(ctx context.Context, cfg *descriptors.Config, knownDomain bool, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s.stats.requests.Add(1)
	if err := s.opts.Input.validate(req); err != nil {
		s.stats.invalid.Add(1)
		return nil, err
	}
	matches := make([]descriptors.Match, len(req.Descriptors))
	matched := make([]bool, len(req.Descriptors))
	var replaced map[string]bool
	for i, d := range req.Descriptors {
		matches[i], matched[i] = cfg.Match(req.Domain, d)
		if r := matches[i].Rule; matched[i] && !r.Unlimited {
			for _, name := range r.Replaces {
				if replaced == nil {
					replaced = make(map[string]bool)
				}
				replaced[name] = true
			}
		}
	}

	// The backend's context is made for the first limited descriptor:
	// unmatched and unlimited ones never reach the backend, and a call
	// made only of them should not pay for a timer.
	var backendCtx context.Context
	cancel := context.CancelFunc(func() {})
	defer func() { cancel() }()
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.Descriptors)),
	}
	var headers headerState
	tally := quotaTally{groupKeys: s.opts.QuotaGroupKeys, keepPassed: s.opts.DynamicMetadata}
	for i, d := range req.Descriptors {
		m := matches[i]
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		unlimited := matched[i] && m.Rule != nil && m.Rule.Unlimited
		// limited: some limit decided the descriptor. Only such a
		// descriptor is a quota of its own and carries its rule's
		// metadata: envoyproxy/ratelimit gives an unmatched or replaced
		// descriptor, or one ending at a node without rate_limit, no
		// limit, so neither its quota_mode nor its metadata.
		limited := false
		switch {
		case !matched[i] || m.Rule == nil:
			s.opts.Observer.Decided(ctx, Decided{Domain: req.Domain, KnownDomain: knownDomain, Outcome: OutcomeUnmatched})
		case unlimited:
			// Unlimited wins over replaces, as in envoyproxy/ratelimit.
			st.LimitRemaining = math.MaxUint32
			s.opts.Observer.Decided(ctx, Decided{Domain: req.Domain, KnownDomain: true, Rule: m.Rule, Entity: m.Entity, Outcome: OutcomeUnlimited})
		case m.Rule.Name != "" && replaced[m.Rule.Name]:
			s.opts.Observer.Decided(ctx, Decided{Domain: req.Domain, KnownDomain: true, Rule: m.Rule, Entity: m.Entity, Outcome: OutcomeReplaced})
		default:
			if backendCtx == nil {
				backendCtx, cancel = s.backendContext(ctx)
			}
			var err error
			if limited, err = s.decide(ctx, backendCtx, req, d, m, st, &headers); err != nil {
				return nil, err
			}
			headers.observe(st)
		}
		over := st.Code == rlsv3.RateLimitResponse_OVER_LIMIT
		if !unlimited {
			// The global setting makes every descriptor but an unlimited
			// one a quota, limited or not, as QUOTA_MODE does there.
			tally.count(i, d, over, s.opts.QuotaMode || (limited && m.Rule.QuotaMode), limited)
		}
		if over && !s.opts.ShadowMode {
			s.stats.over.Add(1)
		} else {
			s.stats.ok.Add(1)
		}
	}
	over, passed := tally.result()
	if over && !s.opts.ShadowMode {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if s.opts.ResponseHeaders {
		resp.ResponseHeadersToAdd = headers.headers()
	}
	if s.opts.DynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, matches, matched, passed)
	}
	return resp, nil
}

// backendContext bounds the backend's work on one call. It ends a little
// before the caller's deadline: a backend that answers at the deadline
// itself leaves no time to send the failure policy's answer, and Envoy,
// having timed out, would apply its own failure_mode_deny instead of the
// operator's --on-backend-error. A fifth of the time left is kept back,
// 3 to 100 ms (4 ms of Envoy's default 20): enough for the answer to cross
// a loopback or a cluster network on a busy machine.
func (s *Service) backendContext(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithTimeout(ctx, s.opts.NoDeadlineTimeout)
	}
	reserve := min(max(time.Until(deadline)/5, 3*time.Millisecond), 100*time.Millisecond)
	return context.WithDeadline(ctx, deadline.Add(-reserve))
}

// decide fills st for one descriptor that reaches the backend. backendCtx
// bounds the backend's work; ctx is the call's own (traces, metrics).
// limited reports that some limit decided it: the backend found one, or
// failed, and then the failure policy stands for the limits it could not
// read.
func (s *Service) decide(ctx, backendCtx context.Context, req *rlsv3.RateLimitRequest, d *rlv3.RateLimitDescriptor, m descriptors.Match, st *rlsv3.RateLimitResponse_DescriptorStatus, headers *headerState) (limited bool, _ error) {
	weight := hits(req, d)
	breq := backend.Request{
		Entity:   m.Entity,
		Resource: m.Resource,
		Parent:   m.Parent,
		Defaults: m.Rule.Limits,
		Global:   m.Rule.Global,
		Hits:     weight,
		Refund:   d.GetIsNegativeHits(),
		Charge:   isCharge(m.Rule.Charges, d, weight),
	}
	var dec backend.Decision
	var err error
	if breq.Charge {
		dec, err = s.decideCharge(ctx, backendCtx, &breq)
	} else {
		dec, err = s.backend.Decide(backendCtx, &breq)
	}
	outcome := OutcomeOK
	limited = err != nil || dec.Limited()
	if err != nil {
		if err := s.onBackendError(ctx, req.Domain, m, err, st); err != nil {
			return true, err
		}
	} else if dec.Limited() {
		fillStatus(st, dec, m.Rule)
		if s.opts.ResponseHeaders {
			headers.limits(dec, m.Rule, !s.opts.ShadowMode && !m.Rule.ShadowMode)
		}
		if l, r := dec.Limits[dec.Binding], dec.Results[dec.Binding]; dec.Allowed &&
			float64(r.Tokens) < (1-s.opts.NearLimitRatio)*float64(l.Burst) {
			outcome = OutcomeNearLimit
		}
	}
	if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
		outcome = OutcomeOverLimit
		// A rule in shadow mode answers its descriptor OK. Global shadow
		// mode keeps each descriptor's own code, so that what would have
		// been denied shows, and answers the request OK (Check), as
		// envoyproxy/ratelimit does with SHADOW_MODE.
		if s.opts.ShadowMode || m.Rule.ShadowMode {
			if m.Rule.ShadowMode {
				st.Code = rlsv3.RateLimitResponse_OK
			}
			s.stats.shadow.Add(1)
			outcome = OutcomeShadowOverLimit
		}
	}
	s.opts.Observer.Decided(ctx, Decided{Domain: req.Domain, KnownDomain: true, Rule: m.Rule, Entity: m.Entity,
		Entries: d.GetEntries(), Hits: weight, Refund: d.GetIsNegativeHits(), Outcome: outcome})
	return limited, nil
}

func (s *Service) onBackendError(ctx context.Context, domain string, m descriptors.Match, err error, st *rlsv3.RateLimitResponse_DescriptorStatus) error {
	s.stats.backendErrors.Add(1)
	s.opts.Observer.FailurePolicyApplied(ctx, domain, s.opts.OnBackendError, err)
	// Backend errors quote entities (request data, often a caller's API
	// key): the warning names only the kind of failure, and the debug line
	// only the error's fields that carry no request data (errorAttrs).
	kind := ErrorKind(err)
	if ok, left := s.failLog.allow(time.Now()); ok {
		s.opts.Logger.LogAttrs(ctx, slog.LevelWarn, "backend failed; applying failure policy",
			slog.String("policy", s.opts.OnBackendError.String()), slog.String("domain", domain),
			slog.String("rule", m.Rule.Path), slog.String("kind", kind), slog.Int("not_logged_since_last", left))
	}
	// Checked first: the fields cost a walk of the error chain on every
	// failing call, and a failing backend fails every call.
	if s.opts.Logger.Enabled(ctx, slog.LevelDebug) {
		s.opts.Logger.LogAttrs(ctx, slog.LevelDebug, "backend error", append([]slog.Attr{slog.String("rule", m.Rule.Path)}, errorAttrs(err)...)...)
	}
	switch s.opts.OnBackendError {
	case FailAllow:
		st.Code = rlsv3.RateLimitResponse_OK
		return nil
	case FailDeny:
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return status.Error(codes.Unavailable, "rate-limit backend did not answer before the deadline")
	}
	// The kind, not the message: the status message ends up in Envoy's
	// logs and in the call's trace span.
	return status.Errorf(codes.Unavailable, "rate-limit backend failed: %s", kind)
}

// hits is the weight of descriptor d: its own hits_addend when set (zero
// checks without consuming), else the request's, where zero means one.
func hits(req *rlsv3.RateLimitRequest, d *rlv3.RateLimitDescriptor) uint64 {
	if h := d.GetHitsAddend(); h != nil {
		return h.GetValue()
	}
	if req.GetHitsAddend() == 0 {
		return 1
	}
	return uint64(req.GetHitsAddend())
}
