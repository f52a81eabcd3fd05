package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/descriptors"
	"github.com/sluice-rl/sluice/ratelimit"
)

const testRules = `
domain: test
descriptors:
  - key: ip
    rate_limit: {name: per_ip, unit: minute, requests_per_unit: 3}
  - key: slow
    limits: [{name: s, rate: 5/10s}]
  - key: unl
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    value: x
    rate_limit: {name: specific, unit: second, requests_per_unit: 1}
  - key: b
    value: y
    rate_limit: {replaces: [{name: specific}], unit: second, requests_per_unit: 100}
  - key: multi
    limits:
      - {name: rpm, rate: 10/min, cost: request}
      - {name: tpm, rate: 1000/min}
  - key: asks
    charges: never
    limits:
      - {name: tpm, rate: 200/min}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: anon
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: free
    rate_limit: {name: free, unlimited: true}
  - key: c
    rate_limit: {replaces: [{name: free}], unit: second, requests_per_unit: 5}
`

type staticRules struct{ cfg *descriptors.Config }

func (r staticRules) Current() *descriptors.Config { return r.cfg }

func rules(t testing.TB, yaml string) staticRules {
	t.Helper()
	cfg, err := descriptors.Parse(map[string][]byte{"test.yaml": []byte(yaml)})
	if err != nil {
		t.Fatal(err)
	}
	return staticRules{cfg}
}

// clock is a settable clock for the memory backend, in epoch ms.
type clock struct{ ms atomic.Int64 }

func (c *clock) now() int64 { return c.ms.Load() }

// serve starts svc over real gRPC on loopback and returns a client.
func serve(t testing.TB, svc *ratelimit.Service) rlsv3.RateLimitServiceClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	ratelimit.Register(srv, svc)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func newService(t testing.TB, opts ratelimit.Options) (rlsv3.RateLimitServiceClient, *clock) {
	clk := &clock{}
	clk.ms.Store(1_700_000_000_000)
	be := memory.New(memory.Options{Now: clk.now, SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	return serve(t, ratelimit.New(rules(t, testRules), be, opts)), clk
}

func desc(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func call(t *testing.T, c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	if req.Domain == "" {
		req.Domain = "test"
	}
	resp, err := c.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Statuses) != len(req.Descriptors) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
	}
	return resp
}

type want struct {
	code      rlsv3.RateLimitResponse_Code
	rpu       uint32
	unit      rlsv3.RateLimitResponse_RateLimit_Unit
	name      string
	remaining uint32
	reset     int64
}

func check(t *testing.T, what string, st *rlsv3.RateLimitResponse_DescriptorStatus, w want) {
	t.Helper()
	got := want{code: st.Code, remaining: st.LimitRemaining, reset: st.GetDurationUntilReset().GetSeconds()}
	if l := st.CurrentLimit; l != nil {
		got.rpu, got.unit, got.name = l.RequestsPerUnit, l.Unit, l.Name
	}
	if got != w {
		t.Errorf("%s:\n got %+v\nwant %+v", what, got, w)
	}
}

func TestBurstRemainingAndReset(t *testing.T) {
	c, clk := newService(t, ratelimit.Options{})
	req := &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("ip", "10.0.0.1")}}
	const m = rlsv3.RateLimitResponse_RateLimit_MINUTE
	// 3 per minute: a token every 20 s. While allowed, reset is the time
	// until the bucket is full again.
	check(t, "1st", call(t, c, req).Statuses[0], want{rlsv3.RateLimitResponse_OK, 3, m, "per_ip", 2, 20})
	check(t, "2nd", call(t, c, req).Statuses[0], want{rlsv3.RateLimitResponse_OK, 3, m, "per_ip", 1, 40})
	check(t, "3rd", call(t, c, req).Statuses[0], want{rlsv3.RateLimitResponse_OK, 3, m, "per_ip", 0, 60})
	resp := call(t, c, req)
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("overall %v after the burst", resp.OverallCode)
	}
	// Denied: reset is the retry-after, rounded up to whole seconds.
	check(t, "4th", resp.Statuses[0], want{rlsv3.RateLimitResponse_OVER_LIMIT, 3, m, "per_ip", 0, 20})
	clk.ms.Add(19_001)
	check(t, "after 19.001 s", call(t, c, req).Statuses[0], want{rlsv3.RateLimitResponse_OVER_LIMIT, 3, m, "per_ip", 0, 1})
	clk.ms.Add(999)
	check(t, "after 20 s", call(t, c, req).Statuses[0], want{rlsv3.RateLimitResponse_OK, 3, m, "per_ip", 0, 60})
}

func TestStatusPerDescriptorAndOverall(t *testing.T) {
	c, _ := newService(t, ratelimit.Options{})
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	resp := call(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{
		desc("nomatch", "v"),
		desc("unl", "v"),
		desc("slow", "v"),
		desc("blocked", "v"),
		desc("anon", "v"),
	}})
	if resp.OverallCode != over {
		t.Errorf("overall %v with a blocked descriptor", resp.OverallCode)
	}
	check(t, "unmatched", resp.Statuses[0], want{code: ok})
	check(t, "unlimited", resp.Statuses[1], want{code: ok, remaining: math.MaxUint32})
	// 5 per 10 s is reported per the next longer unit: 30 per minute.
	check(t, "5/10s", resp.Statuses[2], want{ok, 30, rlsv3.RateLimitResponse_RateLimit_MINUTE, "s", 4, 2})
	// A zero rate never refills: come back after one period. The unnamed
	// rate_limit reports an empty name, as envoyproxy/ratelimit does.
	check(t, "zero rate", resp.Statuses[3], want{over, 0, rlsv3.RateLimitResponse_RateLimit_SECOND, "", 0, 1})
	check(t, "per hour", resp.Statuses[4], want{ok, 7, rlsv3.RateLimitResponse_RateLimit_HOUR, "", 6, 515})
	// Each descriptor is decided on its own: the passing ones consumed.
	resp = call(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("slow", "v")}})
	if resp.Statuses[0].LimitRemaining != 3 {
		t.Errorf("passing descriptor beside an over-limit one did not consume: %d left", resp.Statuses[0].LimitRemaining)
	}
}

func TestHitsRules(t *testing.T) {
	c, _ := newService(t, ratelimit.Options{})
	d := desc("multi", "k")
	// The request's hits_addend applies to descriptors without their own.
	resp := call(t, c, &rlsv3.RateLimitRequest{HitsAddend: 600, Descriptors: []*rlv3.RateLimitDescriptor{d}})
	// rpm costs one per request (9/10 left), tpm 600 (400/1000 left): the
	// binding limit is the one with the least left relative to its burst.
	check(t, "600 hits", resp.Statuses[0], want{rlsv3.RateLimitResponse_OK, 1000, rlsv3.RateLimitResponse_RateLimit_MINUTE, "tpm", 400, 36})
	// A descriptor's own hits_addend wins; zero checks without consuming.
	d.HitsAddend = wrapperspb.UInt64(0)
	resp = call(t, c, &rlsv3.RateLimitRequest{HitsAddend: 600, Descriptors: []*rlv3.RateLimitDescriptor{d}})
	if resp.Statuses[0].LimitRemaining != 400 || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK {
		t.Errorf("check-only call: %+v", resp.Statuses[0])
	}
	// A descriptor's own hits_addend above zero is a charge of tokens
	// already used (descriptors.ChargesOwnHits): beyond what is left it
	// is answered OVER_LIMIT and lands anyway, into debt (400 - 500 and
	// the one request rpm counts), and the limit then denies even a
	// check until refill has repaid it: 100 tokens at 1000 a minute, 6 s.
	d.HitsAddend = wrapperspb.UInt64(500)
	resp = call(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{d}})
	if resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].CurrentLimit.Name != "tpm" ||
		resp.Statuses[0].LimitRemaining != 0 || resp.Statuses[0].GetDurationUntilReset().GetSeconds() != 7 {
		t.Errorf("a charge of 500 on 400 tokens: %+v", resp.Statuses[0])
	}
	d.HitsAddend = wrapperspb.UInt64(0)
	resp = call(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{d}})
	if resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].CurrentLimit.Name != "tpm" {
		t.Errorf("a check in debt: %+v", resp.Statuses[0])
	}
	// A refund gives tokens back (never past the burst), repaying the
	// debt first.
	d.HitsAddend, d.IsNegativeHits = wrapperspb.UInt64(300), true
	resp = call(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{d}})
	if resp.Statuses[0].LimitRemaining != 200 || resp.Statuses[0].CurrentLimit.Name != "tpm" {
		t.Errorf("after a refund of 300 on a debt of 100: %+v", resp.Statuses[0])
	}
	d.IsNegativeHits = false
	// A request's own hits are asked for, not charged, where the rule
	// says so (charges: never): 300 of 200 is denied and takes nothing.
	n := desc("asks", "k")
	n.HitsAddend = wrapperspb.UInt64(300)
	for range 2 {
		resp = call(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{n}})
		if resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].LimitRemaining != 200 {
			t.Errorf("300 of 200 on a rule that never charges: %+v", resp.Statuses[0])
		}
	}
	// Request-level zero means one.
	resp = call(t, c, &rlsv3.RateLimitRequest{HitsAddend: 0, Descriptors: []*rlv3.RateLimitDescriptor{desc("ip", "z")}})
	if resp.Statuses[0].LimitRemaining != 2 {
		t.Errorf("hits_addend 0 did not count as one: %d left", resp.Statuses[0].LimitRemaining)
	}
}

func TestShadowModeAndReplaces(t *testing.T) {
	c, _ := newService(t, ratelimit.Options{})
	sh := &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("shadow", "v")}}
	call(t, c, sh)
	resp := call(t, c, sh)
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK ||
		resp.Statuses[0].CurrentLimit == nil {
		t.Errorf("shadow rule over its limit: %+v", resp)
	}

	// (a=x) is replaced by (b=y)'s rule: it answers OK without a limit,
	// however often it is sent.
	rep := &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("a", "x"), desc("b", "y")}}
	for i := 0; i < 3; i++ {
		resp = call(t, c, rep)
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].CurrentLimit.RequestsPerUnit != 100 {
			t.Fatalf("replaced limit still applied: %+v", resp)
		}
	}
	// Alone, (a=x) has its own 1/s limit.
	alone := &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("a", "x")}}
	call(t, c, alone)
	if call(t, c, alone).OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Error("(a=x) alone is not limited")
	}

	// An unlimited rule stays unlimited even when another rule names it in
	// replaces.
	resp = call(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("free", "v"), desc("c", "v")}})
	if resp.Statuses[0].LimitRemaining != math.MaxUint32 || resp.Statuses[1].CurrentLimit.GetRequestsPerUnit() != 5 {
		t.Errorf("unlimited beside a rule replacing it: %+v", resp.Statuses)
	}

	// Global shadow mode answers the request OK but keeps each
	// descriptor's own code, as envoyproxy/ratelimit's SHADOW_MODE does:
	// what would have been denied shows. A rule's shadow_mode answers its
	// descriptor OK.
	mem := memory.New(memory.Options{SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	svc := ratelimit.New(rules(t, testRules), mem, ratelimit.Options{ShadowMode: true})
	global := serve(t, svc)
	blocked := &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("blocked", "v"), desc("shadow", "w")}}
	call(t, global, blocked)
	resp = call(t, global, blocked)
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit == nil ||
		resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[1].Code != rlsv3.RateLimitResponse_OK {
		t.Errorf("global shadow mode, a blocked descriptor and a shadow rule's over its limit: %+v", resp)
	}
	if st := svc.Stats(); st.OverLimit != 0 || st.ShadowOverLimit != 3 {
		t.Errorf("global shadow mode counted %d over the limit and %d shadowed, want 0 and 3", st.OverLimit, st.ShadowOverLimit)
	}
}

func TestResponseHeaders(t *testing.T) {
	c, _ := newService(t, ratelimit.Options{ResponseHeaders: true})
	resp := call(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("slow", "v"), desc("ip", "1")}})
	got := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		got[h.Key] = h.Value
	}
	// ip has 2 left (of 3 per minute), fewer than slow's 4.
	if got["RateLimit-Limit"] != "3" || got["RateLimit-Remaining"] != "2" || got["RateLimit-Reset"] != "20" {
		t.Errorf("headers %v", got)
	}
	plain, _ := newService(t, ratelimit.Options{})
	if len(call(t, plain, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("ip", "1")}}).ResponseHeadersToAdd) != 0 {
		t.Error("headers added without the option")
	}
}

// With several named limits, the IETF fields RateLimit-Policy and
// RateLimit describe each of them, one item per name, and the limit that
// denied comes first: a client that reads the first item backs off by the
// limit that holds it back, not by the one with the most left.
func TestResponseHeadersNameEveryLimit(t *testing.T) {
	c, _ := newService(t, ratelimit.Options{ResponseHeaders: true})
	headers := func(resp *rlsv3.RateLimitResponse) map[string]string {
		got := map[string]string{}
		for _, h := range resp.ResponseHeadersToAdd {
			got[h.Key] = h.Value
		}
		return got
	}
	// 600 hits: rpm 9 of 10 left, tpm 400 of 1000; both reset within
	// a minute of refill (rpm's one request: 6 s).
	got := headers(call(t, c, &rlsv3.RateLimitRequest{HitsAddend: 600, Descriptors: []*rlv3.RateLimitDescriptor{desc("multi", "k")}}))
	if want := `"rpm";q=10;w=60, "tpm";q=1000;w=60`; got["RateLimit-Policy"] != want {
		t.Errorf("RateLimit-Policy %q, want %q", got["RateLimit-Policy"], want)
	}
	if want := `"rpm";r=9;t=6, "tpm";r=400;t=36`; got["RateLimit"] != want {
		t.Errorf("RateLimit %q, want %q", got["RateLimit"], want)
	}
	// 500 more is over on tpm (asked, not charged: the request's own
	// hits_addend): tpm comes first, with the time until 500 are there.
	got = headers(call(t, c, &rlsv3.RateLimitRequest{HitsAddend: 500, Descriptors: []*rlv3.RateLimitDescriptor{desc("multi", "k")}}))
	if want := `"tpm";r=400;t=6, "rpm";r=9;t=6`; got["RateLimit"] != want {
		t.Errorf("RateLimit when tpm denies %q, want %q", got["RateLimit"], want)
	}
	if got["RateLimit-Remaining"] != "400" {
		t.Errorf("RateLimit-Remaining %q when tpm denies, want its 400", got["RateLimit-Remaining"])
	}
}

// failing is a backend that fails like an unreachable store: it fails at
// once, or (slow) only when the caller's deadline expires.
type failing struct{ slow bool }

func (f failing) Decide(ctx context.Context, _ *backend.Request) (backend.Decision, error) {
	if f.slow {
		<-ctx.Done()
		return backend.Decision{}, ctx.Err()
	}
	return backend.Decision{}, errors.New("connection refused")
}

func TestFailurePolicy(t *testing.T) {
	req := &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlv3.RateLimitDescriptor{desc("ip", "1"), desc("nomatch", "x")}}
	for _, c := range []struct {
		policy ratelimit.FailurePolicy
		code   rlsv3.RateLimitResponse_Code
	}{{ratelimit.FailAllow, rlsv3.RateLimitResponse_OK}, {ratelimit.FailDeny, rlsv3.RateLimitResponse_OVER_LIMIT}} {
		svc := ratelimit.New(rules(t, testRules), failing{}, ratelimit.Options{OnBackendError: c.policy})
		resp, err := serve(t, svc).ShouldRateLimit(context.Background(), req)
		if err != nil || resp.OverallCode != c.code || resp.Statuses[0].Code != c.code || resp.Statuses[1].Code != rlsv3.RateLimitResponse_OK {
			t.Errorf("policy %v: %v %v", c.policy, resp, err)
		}
		if svc.Stats().BackendErrors != 1 {
			t.Errorf("policy %v: backend error not counted", c.policy)
		}
	}
	_, err := serve(t, ratelimit.New(rules(t, testRules), failing{}, ratelimit.Options{})).ShouldRateLimit(context.Background(), req)
	if status.Code(err) != codes.Unavailable {
		t.Errorf("policy error: %v, want UNAVAILABLE", err)
	}

}

// A backend that hangs is cut off before the caller's deadline, so the
// caller gets the failure policy's answer instead of its own timeout
// (which Envoy would settle with failure_mode_deny, not the operator's
// policy). Over real gRPC: the answer has to travel back in time. (Envoy's
// default 20 ms keeps 4 ms back. This test's deadlines keep 40 and 100 ms
// back, so that it holds under -race on a loaded two-core machine, where
// a goroutine can wait over 10 ms to run: with a 50 ms deadline, 10 ms
// back, an answer came at 61 ms beside a benchmark. Without the reserve
// every call here fails with the caller's own timeout.)
func TestFailurePolicyBeatsTheDeadline(t *testing.T) {
	req := &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlv3.RateLimitDescriptor{desc("ip", "1")}}
	for _, c := range []struct {
		policy ratelimit.FailurePolicy
		code   codes.Code
		want   rlsv3.RateLimitResponse_Code
	}{
		{ratelimit.FailError, codes.Unavailable, 0},
		{ratelimit.FailAllow, codes.OK, rlsv3.RateLimitResponse_OK},
		{ratelimit.FailDeny, codes.OK, rlsv3.RateLimitResponse_OVER_LIMIT},
	} {
		client := serve(t, ratelimit.New(rules(t, testRules), failing{slow: true}, ratelimit.Options{OnBackendError: c.policy}))
		for _, timeout := range []time.Duration{200 * time.Millisecond, time.Second} {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			start := time.Now()
			resp, err := client.ShouldRateLimit(ctx, req)
			took := time.Since(start)
			cancel()
			if status.Code(err) != c.code || (err == nil && resp.OverallCode != c.want) {
				t.Errorf("policy %v, deadline %v: got %v %v after %v, want %v %v", c.policy, timeout, resp, err, took, c.code, c.want)
			}
			if took < timeout/2 {
				t.Errorf("policy %v, deadline %v: answered after %v: the backend was not given most of the time", c.policy, timeout, took)
			}
		}
	}

	// A call without a deadline is bounded too.
	svc := ratelimit.New(rules(t, testRules), failing{slow: true}, ratelimit.Options{OnBackendError: ratelimit.FailAllow, NoDeadlineTimeout: 50 * time.Millisecond})
	start := time.Now()
	resp, err := serve(t, svc).ShouldRateLimit(context.Background(), req)
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || time.Since(start) > 5*time.Second {
		t.Fatalf("no deadline: %v %v after %v", resp, err, time.Since(start))
	}
}

func TestBadInputIsInvalidArgument(t *testing.T) {
	c, _ := newService(t, ratelimit.Options{})
	many := make([]*rlv3.RateLimitDescriptor_Entry, 10_000)
	for i := range many {
		many[i] = &rlv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"}
	}
	cases := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		msg  string
	}{
		{"empty domain", &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("ip", "1")}}, "domain is empty"},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "test"}, "no descriptors"},
		{"empty key", &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlv3.RateLimitDescriptor{desc("", "1")}}, "empty key"},
		{"no entries", &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlv3.RateLimitDescriptor{{}}}, "no entries"},
		{"10 000 entries", &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: many}}}, "10000 entries, over the limit of 32"},
		{"1 MiB value", &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlv3.RateLimitDescriptor{desc("ip", strings.Repeat("x", 1<<20))}}, "over the limit of 4096"},
		{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "test", Descriptors: func() []*rlv3.RateLimitDescriptor {
			ds := make([]*rlv3.RateLimitDescriptor, 65)
			for i := range ds {
				ds[i] = desc("ip", "1")
			}
			return ds
		}()}, "65 descriptors, over the limit of 64"},
	}
	for _, tc := range cases {
		_, err := c.ShouldRateLimit(context.Background(), tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT naming %q", tc.name, err, tc.msg)
		}
	}

	// Odd but valid input is decided, not refused.
	d := desc("ip", "a#b%c/%2F")
	d.HitsAddend = wrapperspb.UInt64(math.MaxUint64)
	resp := call(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{d}})
	if resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("2^64-1 hits: %+v", resp.Statuses[0])
	}
	// A charge of that much takes the limit to its floor: the next
	// request is denied.
	if resp := call(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("ip", "a#b%c/%2F")}}); resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].LimitRemaining != 0 {
		t.Errorf("value with # and %%, after a charge of 2^64-1: %+v", resp.Statuses[0])
	}
}

// rawCodec sends pre-encoded bytes, so a test can send what a well-behaved
// Go client refuses to encode (invalid UTF-8 in a proto3 string).
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }
func (rawCodec) Name() string                       { return "proto" }

// Invalid UTF-8 cannot be decoded into a proto3 string, so gRPC refuses
// the call before the service sees it; what matters is a clear error and a
// server that goes on serving.
func TestInvalidUTF8IsRefusedCleanly(t *testing.T) {
	clk := &clock{}
	be := memory.New(memory.Options{Now: clk.now, SweepInterval: -1})
	defer be.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	ratelimit.Register(srv, ratelimit.New(rules(t, testRules), be, ratelimit.Options{}))
	go srv.Serve(ln)
	defer srv.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	var entry, descriptor, msg []byte
	entry = protowire.AppendTag(entry, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, "ip")
	entry = protowire.AppendTag(entry, 2, protowire.BytesType)
	entry = protowire.AppendBytes(entry, []byte{0xff, 0xfe, 'x'})
	descriptor = protowire.AppendTag(descriptor, 1, protowire.BytesType)
	descriptor = protowire.AppendBytes(descriptor, entry)
	msg = protowire.AppendTag(msg, 1, protowire.BytesType)
	msg = protowire.AppendString(msg, "test")
	msg = protowire.AppendTag(msg, 2, protowire.BytesType)
	msg = protowire.AppendBytes(msg, descriptor)

	var resp rlsv3.RateLimitResponse
	err = conn.Invoke(context.Background(), rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, msg, &resp, grpc.ForceCodec(rawCodec{}))
	if err == nil || !strings.Contains(err.Error(), "invalid UTF-8") {
		t.Fatalf("invalid UTF-8: %v, want an error naming it", err)
	}
	// The server is still there for the next, well-formed call.
	resp.Reset()
	good, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlv3.RateLimitDescriptor{desc("ip", "1")}})
	if err := conn.Invoke(context.Background(), rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, good, &resp, grpc.ForceCodec(rawCodec{})); err != nil || len(resp.Statuses) != 1 {
		t.Fatalf("well-formed call after a bad one: %v %v", &resp, err)
	}
}

// A header that is present but empty reaches Sluice as an entry with an
// empty value. As in envoyproxy/ratelimit, it is limited by the key's rule
// in a bucket of its own: a client cannot escape a limit (or a block) by
// sending the header empty, and does not share the bucket of a real value.
func TestEmptyValueIsLimited(t *testing.T) {
	c, _ := newService(t, ratelimit.Options{})
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	resp := call(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("blocked", "")}})
	check(t, "blocked, empty value", resp.Statuses[0], want{over, 0, rlsv3.RateLimitResponse_RateLimit_SECOND, "", 0, 1})
	for i, w := range []uint32{6, 5} {
		resp = call(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("anon", "")}})
		check(t, fmt.Sprintf("anon, empty value, call %d", i+1), resp.Statuses[0], want{ok, 7, rlsv3.RateLimitResponse_RateLimit_HOUR, "", w, 515 * int64(i+1)})
	}
	resp = call(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("anon", "x")}})
	check(t, "anon, a value", resp.Statuses[0], want{ok, 7, rlsv3.RateLimitResponse_RateLimit_HOUR, "", 6, 515})
}
