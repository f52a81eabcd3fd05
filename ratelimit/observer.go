package ratelimit

import (
	"context"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"

	"github.com/sluice-rl/sluice/descriptors"
)

// Observer hears what the service decides, for metrics and traces. Its
// methods run on the request path, so they must be quick, and safe for
// concurrent use.
type Observer interface {
	// Decided reports the outcome of one descriptor of a valid request.
	Decided(ctx context.Context, d Decided)
	// Answered reports a finished call, valid or not.
	Answered(ctx context.Context, a Answered)
	// FailurePolicyApplied reports a backend failure and the policy that
	// answered for it.
	FailurePolicyApplied(ctx context.Context, domain string, policy FailurePolicy, err error)
}

// Outcome is what became of one descriptor.
type Outcome int

const (
	// OutcomeOK: allowed, with tokens to spare (or not limited at all).
	OutcomeOK Outcome = iota
	// OutcomeNearLimit: allowed, but the binding limit has less than
	// 1 - NearLimitRatio of its burst left.
	OutcomeNearLimit
	// OutcomeOverLimit: denied.
	OutcomeOverLimit
	// OutcomeShadowOverLimit: over the limit, answered OK by shadow mode.
	OutcomeShadowOverLimit
	// OutcomeUnlimited: the rule says unlimited.
	OutcomeUnlimited
	// OutcomeUnmatched: no rule matched the descriptor.
	OutcomeUnmatched
	// OutcomeReplaced: another matched rule of the request replaces this
	// one (rate_limit.replaces): answered OK, not decided.
	OutcomeReplaced
)

func (o Outcome) String() string {
	return [...]string{"ok", "near_limit", "over_limit", "shadow_over_limit", "unlimited", "unmatched", "replaced"}[o]
}

// Decided is the outcome of one descriptor.
type Decided struct {
	// Domain is the request's domain; KnownDomain says whether the rules
	// define it (a descriptor in an unknown domain is unmatched).
	Domain      string
	KnownDomain bool
	// Rule is the rule that matched; nil for OutcomeUnmatched.
	Rule *descriptors.Rule
	// Entity is the bucket's entity: request data, for the metrics of
	// rules that opt in (detailed_metric) and nothing else.
	Entity string
	// Entries are the request descriptor's entries, as given to
	// descriptors.Rule.StatsKey; request data, like Entity. Hits is the
	// descriptor's weight (its hits_addend, or the request's).
	Entries []*rlv3.RateLimitDescriptor_Entry
	Hits    uint64
	// Refund says the descriptor gave Hits back (is_negative_hits).
	Refund  bool
	Outcome Outcome
}

// Answered is one finished call.
type Answered struct {
	// Domain is the request's domain; KnownDomain says whether the rules
	// define it (an unknown one is request data of any value).
	Domain      string
	KnownDomain bool
	// Code is the gRPC status code returned; Overall the decision, when
	// Code is OK.
	Code     codes.Code
	Overall  rlsv3.RateLimitResponse_Code
	Duration time.Duration
}

// nopObserver is the Observer of a service given none.
type nopObserver struct{}

func (nopObserver) Decided(context.Context, Decided)                                   {}
func (nopObserver) Answered(context.Context, Answered)                                 {}
func (nopObserver) FailurePolicyApplied(context.Context, string, FailurePolicy, error) {}
