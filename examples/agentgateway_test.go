package examples

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/descriptors"
	"github.com/sluice-rl/sluice/ratelimit"
)

// agentgatewayConfig is the part of agentgateway's standalone config file
// that examples/ai-gateways/agentgateway.yaml uses, written field by field
// from agentgateway's configuration schema: agentgateway is a Rust
// program, and the Go module of its controller is not served by the module
// proxy this project builds from (go list answers 403), so no type of its
// own can be imported. Decoded strictly, a misspelt or misplaced key in
// the example fails here as agentgateway would refuse it.
type agentgatewayConfig struct {
	Binds []struct {
		Port      int `json:"port"`
		Listeners []struct {
			Name     string `json:"name,omitempty"`
			Protocol string `json:"protocol,omitempty"`
			Routes   []struct {
				Name     string `json:"name,omitempty"`
				Backends []struct {
					AI *struct {
						Name     string `json:"name"`
						Provider struct {
							OpenAI *struct {
								Model string `json:"model,omitempty"`
							} `json:"openAI,omitempty"`
						} `json:"provider"`
					} `json:"ai,omitempty"`
				} `json:"backends"`
				Policies struct {
					RemoteRateLimit *agentgatewayRemoteRateLimit `json:"remoteRateLimit,omitempty"`
				} `json:"policies"`
			} `json:"routes"`
		} `json:"listeners"`
	} `json:"binds"`
}

type agentgatewayRemoteRateLimit struct {
	Host        string `json:"host,omitempty"`
	Domain      string `json:"domain"`
	FailureMode string `json:"failureMode,omitempty"`
	Descriptors []struct {
		Entries []struct {
			Key   string `json:"key"`
			Value string `json:"value"`
		} `json:"entries"`
		Type string  `json:"type,omitempty"`
		Cost *string `json:"cost,omitempty"`
	} `json:"descriptors"`
}

// agentgatewayRequest is one client request as the example's descriptors
// see it.
type agentgatewayRequest struct {
	headers map[string]string
}

// celValue evaluates the two shapes of CEL expression the example's
// entries use: a string literal and a request header. Anything else fails
// the test, so that the example cannot grow an expression this test does
// not understand.
func celValue(t *testing.T, expr string, req agentgatewayRequest) string {
	t.Helper()
	if len(expr) >= 2 && expr[0] == '"' && expr[len(expr)-1] == '"' {
		return expr[1 : len(expr)-1]
	}
	const pre, post = `request.headers["`, `"]`
	if strings.HasPrefix(expr, pre) && strings.HasSuffix(expr, post) {
		return req.headers[strings.TrimSuffix(strings.TrimPrefix(expr, pre), post)]
	}
	t.Fatalf("entry value %q: this test evaluates only string literals and request.headers[...]", expr)
	return ""
}

// agentgatewayStack is the example's agentgateway in front of Sluice with
// the example's rules, on a clock the test moves.
type agentgatewayStack struct {
	t   *testing.T
	rl  *agentgatewayRemoteRateLimit
	svc *ratelimit.Service
	now func(time.Duration)
}

func newAgentgatewayStack(t *testing.T) *agentgatewayStack {
	var c agentgatewayConfig
	decodeAIExample(t, "agentgateway.yaml", &c)
	if len(c.Binds) != 1 || len(c.Binds[0].Listeners) != 1 || len(c.Binds[0].Listeners[0].Routes) != 1 {
		t.Fatalf("agentgateway.yaml: want one bind, listener and route: %+v", c)
	}
	route := c.Binds[0].Listeners[0].Routes[0]
	if len(route.Backends) != 1 || route.Backends[0].AI == nil || route.Backends[0].AI.Provider.OpenAI == nil {
		t.Errorf("the route's backend is not an AI backend: %+v", route.Backends)
	}
	rl := route.Policies.RemoteRateLimit
	if rl == nil {
		t.Fatal("the route has no remoteRateLimit policy")
	}
	if !strings.HasSuffix(rl.Host, ":8081") {
		t.Errorf("remoteRateLimit.host %q is not Sluice's gRPC port (--grpc-addr :8081)", rl.Host)
	}
	if rl.FailureMode != "failClosed" && rl.FailureMode != "failOpen" {
		t.Errorf("failureMode %q: agentgateway takes failOpen or failClosed", rl.FailureMode)
	}
	for _, d := range rl.Descriptors {
		if d.Type != "tokens" && d.Type != "requests" {
			t.Errorf("descriptor type %q: agentgateway takes tokens or requests", d.Type)
		}
	}

	cfg, err := descriptors.Load(filepath.Join("ai-gateways", "rules"))
	if err != nil {
		t.Fatalf("examples/ai-gateways/rules: %v", err)
	}
	var clock int64 = 1_700_000_000_000
	be := memory.New(memory.Options{Now: func() int64 { return clock }, SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	return &agentgatewayStack{
		t:   t,
		rl:  rl,
		svc: ratelimit.New(envoyStaticRules{cfg}, be, ratelimit.Options{}),
		now: func(d time.Duration) { clock += d.Milliseconds() },
	}
}

// call sends the example's descriptors of type kind as agentgateway does:
// a requests descriptor without hits_addend (its cost, one, is the
// service's default), a tokens descriptor with hits as its own
// hits_addend. It returns the answer.
func (s *agentgatewayStack) call(kind string, req agentgatewayRequest, hits uint64) *rlsv3.RateLimitResponse {
	s.t.Helper()
	r := &rlsv3.RateLimitRequest{Domain: s.rl.Domain}
	for _, d := range s.rl.Descriptors {
		if d.Type != kind {
			continue
		}
		desc := &rlv3.RateLimitDescriptor{}
		for _, e := range d.Entries {
			desc.Entries = append(desc.Entries, &rlv3.RateLimitDescriptor_Entry{Key: e.Key, Value: celValue(s.t, e.Value, req)})
		}
		if kind == "tokens" {
			desc.HitsAddend = wrapperspb.UInt64(hits)
		}
		r.Descriptors = append(r.Descriptors, desc)
	}
	if len(r.Descriptors) == 0 {
		s.t.Fatalf("the example has no %s descriptor", kind)
	}
	resp, err := s.svc.ShouldRateLimit(context.Background(), r)
	if err != nil {
		s.t.Fatal(err)
	}
	for i, st := range resp.GetStatuses() {
		if st.GetCurrentLimit() == nil {
			s.t.Fatalf("the %s descriptor %d matched no limit of examples/ai-gateways/rules", kind, i)
		}
	}
	return resp
}

// request is one request through agentgateway: the request-time calls
// (requests, then tokens with the descriptor's own 0), and when both pass
// the model answers with used tokens, charged after the response. It
// returns whether the request reached the model, and the name of the
// limit that denied it.
func (s *agentgatewayStack) request(tenant string, used uint64) (bool, string) {
	s.t.Helper()
	req := agentgatewayRequest{headers: map[string]string{"x-tenant-id": tenant}}
	for _, kind := range []string{"requests", "tokens"} {
		resp := s.call(kind, req, 0)
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			for _, st := range resp.GetStatuses() {
				if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
					return false, st.GetCurrentLimit().GetName()
				}
			}
			return false, "?"
		}
	}
	// agentgateway ignores the answer to the charge.
	s.call("tokens", req, used)
	return true, ""
}

// The agentgateway example of docs/ai-gateways.md decodes strictly into
// agentgateway's config fields, its descriptors all reach a limit of the
// example's rules, and through agentgateway's calls the tenant's tokens
// and requests are both held: a charge after the response lands beyond
// what is left (the tenant in debt, denied until refill has repaid it),
// a charge past the debt floor is forgiven beyond it, and a flood of
// plain requests at the request limit takes nothing when denied. The
// manual shows both files as they are.
func TestAgentgatewayExample(t *testing.T) {
	s := newAgentgatewayStack(t)
	expect := func(what, tenant string, used uint64, want bool, wantLimit string) {
		t.Helper()
		got, limit := s.request(tenant, used)
		if got != want || limit != wantLimit {
			t.Fatalf("%s: reached the model %v (denied by %q), want %v (%q)", what, got, limit, want, wantLimit)
		}
	}

	// 40,000 tokens a minute: three responses of 15,000 each take the
	// tenant 5,000 into debt; the fourth request is denied on tpm until
	// refill (666.7 a second) has repaid it, 7.5 s later.
	for i := range 3 {
		expect(fmt.Sprintf("acme request %d", i+1), "acme", 15000, true, "")
	}
	expect("acme in debt", "acme", 10, false, "tpm")
	s.now(7 * time.Second)
	expect("acme 7 s later, 333 still owed", "acme", 10, false, "tpm")
	s.now(time.Second)
	expect("acme 8 s later, repaid", "acme", 10, true, "")

	// A charge of a million tokens stops at the floor, 20,000 below zero:
	// repaid in 30 s, the rest forgiven.
	expect("big's one huge response", "big", 1_000_000, true, "")
	s.now(29 * time.Second)
	expect("big 29 s later", "big", 10, false, "tpm")
	s.now(2 * time.Second)
	expect("big 31 s later", "big", 10, true, "")

	// 20 requests a minute: the 21st is denied on rpm, and so is a flood
	// after it, which takes nothing: the next token, 3 s later, admits one.
	for i := range 20 {
		expect(fmt.Sprintf("small request %d", i+1), "small", 10, true, "")
	}
	for i := range 100 {
		expect(fmt.Sprintf("flood %d", i+1), "small", 10, false, "rpm")
	}
	s.now(3 * time.Second)
	expect("small 3 s later", "small", 10, true, "")
	expect("small again", "small", 10, false, "rpm")

	manualShows(t, "agentgateway.yaml", "binds:")
	manualShows(t, "rules/agentgateway.yaml", "domain:")
}
