package ratelimit

import "fmt"

// FailurePolicy says what to answer when the backend cannot decide in
// time or fails (the --on-backend-error flag).
type FailurePolicy int

const (
	// FailError answers gRPC UNAVAILABLE and leaves the choice to Envoy's
	// failure_mode_deny. It is the zero value and the default.
	FailError FailurePolicy = iota
	// FailAllow answers OK: the request passes.
	FailAllow
	// FailDeny answers OVER_LIMIT: the request is refused.
	FailDeny
)

// ParseFailurePolicy reads "error", "allow" or "deny".
func ParseFailurePolicy(s string) (FailurePolicy, error) {
	switch s {
	case "error":
		return FailError, nil
	case "allow":
		return FailAllow, nil
	case "deny":
		return FailDeny, nil
	}
	return 0, fmt.Errorf("unknown failure policy %q (want error, allow or deny)", s)
}

func (p FailurePolicy) String() string {
	switch p {
	case FailAllow:
		return "allow"
	case FailDeny:
		return "deny"
	}
	return "error"
}
