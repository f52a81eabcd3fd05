package ratelimit

import (
	"context"
	"fmt"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/descriptors"
)

// ChargeTimeout bounds the backend's work on a charge (isCharge), which
// goes on after its caller's deadline.
const ChargeTimeout = 2 * time.Second

// maxDetachedCharges bounds the charges a Service writes past their
// callers' deadlines at once: beyond it (a store that has stopped
// answering, at thousands of charges a second) a charge ends with its
// caller's deadline, as any call does.
const maxDetachedCharges = 4096

// isCharge reports whether descriptor d, of weight hits, charges tokens
// already used under rule c (descriptors.Charges): by default, when it
// carries its own hits_addend above zero, as the gateways that charge at
// stream end send it.
func isCharge(c descriptors.Charges, d *rlv3.RateLimitDescriptor, hits uint64) bool {
	if hits == 0 || d.GetIsNegativeHits() {
		return false
	}
	switch c {
	case descriptors.ChargesAlways:
		return true
	case descriptors.ChargesNever:
		return false
	}
	return d.GetHitsAddend() != nil
}

// decideCharge decides a charge: what it counts was used already, so it
// is written even after the caller's deadline (within ChargeTimeout of
// its own), while the caller is answered by backendCtx's end at the
// latest, as for any call (the failure policy, if the store is slower).
// Envoy ignores the answer to a charge at stream end, but not to one at
// request time (Envoy Gateway's cost.request from a number).
func (s *Service) decideCharge(ctx, backendCtx context.Context, req *backend.Request) (backend.Decision, error) {
	select {
	case s.charging <- struct{}{}:
	default:
		return s.backend.Decide(backendCtx, req)
	}
	type answer struct {
		dec backend.Decision
		err error
	}
	done := make(chan answer, 1)
	r := *req // the caller may return, and reuse req, before the write ends
	go func() {
		defer func() { <-s.charging }()
		defer func() {
			if p := recover(); p != nil {
				done <- answer{err: fmt.Errorf("charge panicked: %v", p)}
			}
		}()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ChargeTimeout)
		defer cancel()
		dec, err := s.backend.Decide(cctx, &r)
		done <- answer{dec, err}
	}()
	select {
	case a := <-done:
		return a.dec, a.err
	case <-backendCtx.Done():
		return backend.Decision{}, backendCtx.Err()
	}
}

// Settle waits until the charges still being written past their
// callers' deadlines have landed, or ctx ends. A server calls it on
// shutdown, after its last call has been answered and before it closes
// the backend: Envoy ignores the answer to a charge, so one cut off
// mid-write is lost without anyone knowing. Settle leaves the Service as
// it found it.
func (s *Service) Settle(ctx context.Context) error {
	held := 0
	defer func() {
		for range held {
			<-s.charging
		}
	}()
	for held < cap(s.charging) {
		select {
		case s.charging <- struct{}{}:
			held++
		case <-ctx.Done():
			return fmt.Errorf("%d charges still being written: %w", cap(s.charging)-held, ctx.Err())
		}
	}
	return nil
}
