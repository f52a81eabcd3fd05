package examples

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/backend/memory"
	"github.com/sluice-rl/sluice/descriptors"
	"github.com/sluice-rl/sluice/ratelimit"
)

// loadEnvoyBootstrap reads ../envoy.yaml as Envoy would: YAML, then the
// proto3 JSON mapping into a v3 Bootstrap, every Any resolved through the
// registry the imports above fill, and unknown fields rejected.
func loadEnvoyBootstrap(t *testing.T) *bootstrapv3.Bootstrap {
	t.Helper()
	raw, err := os.ReadFile("../envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatalf("envoy.yaml as JSON: %v", err)
	}
	bs := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(js, bs); err != nil {
		t.Fatalf("envoy.yaml is not a v3 Bootstrap: %v", err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml fails Envoy's validation rules: %v", err)
	}
	return bs
}

// envoyHCM returns the listener's HTTP connection manager.
func envoyHCM(t *testing.T, bs *bootstrapv3.Bootstrap) *hcmv3.HttpConnectionManager {
	t.Helper()
	ls := bs.GetStaticResources().GetListeners()
	if len(ls) != 1 || len(ls[0].GetFilterChains()) != 1 || len(ls[0].GetFilterChains()[0].GetFilters()) != 1 {
		t.Fatalf("want one listener with one filter chain of one filter")
	}
	hcm := &hcmv3.HttpConnectionManager{}
	if err := ls[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatalf("listener filter: %v", err)
	}
	return hcm
}

// envoyRateLimitFilter is one instance of envoy.filters.http.ratelimit.
type envoyRateLimitFilter struct {
	name string
	cfg  *ratelimitv3.RateLimit
}

func envoyRateLimitFilters(t *testing.T, hcm *hcmv3.HttpConnectionManager) []envoyRateLimitFilter {
	t.Helper()
	var out []envoyRateLimitFilter
	for _, f := range hcm.GetHttpFilters() {
		cfg := &ratelimitv3.RateLimit{}
		if f.GetTypedConfig().MessageIs(cfg) {
			if err := f.GetTypedConfig().UnmarshalTo(cfg); err != nil {
				t.Fatalf("filter %s: %v", f.GetName(), err)
			}
			out = append(out, envoyRateLimitFilter{f.GetName(), cfg})
		}
	}
	return out
}

func TestEnvoyBootstrapIsValid(t *testing.T) {
	bs := loadEnvoyBootstrap(t)

	if a := bs.GetAdmin().GetAddress().GetSocketAddress(); a.GetAddress() != "127.0.0.1" || a.GetPortValue() != 9901 {
		t.Errorf("admin on %s:%d, want 127.0.0.1:9901", a.GetAddress(), a.GetPortValue())
	}
	l := bs.GetStaticResources().GetListeners()[0].GetAddress().GetSocketAddress()
	if l.GetAddress() != "0.0.0.0" || l.GetPortValue() != 10000 {
		t.Errorf("listener on %s:%d, want 0.0.0.0:10000", l.GetAddress(), l.GetPortValue())
	}

	hcm := envoyHCM(t, bs)
	if !hcm.GetUseRemoteAddress().GetValue() {
		t.Error("use_remote_address is off: remote_address would come from X-Forwarded-For")
	}
	filters := hcm.GetHttpFilters()
	if n := len(filters); n == 0 || filters[n-1].GetName() != "envoy.filters.http.router" {
		t.Error("the router is not the last HTTP filter")
	}

	rl := envoyRateLimitFilters(t, hcm)
	wantDomains := []string{"edge", "api"}
	if len(rl) != len(wantDomains) {
		t.Fatalf("%d rate-limit filters, want %d", len(rl), len(wantDomains))
	}
	rules, err := descriptors.Load("config")
	if err != nil {
		t.Fatal(err)
	}
	stages := map[uint32]string{}
	for i, f := range rl {
		c := f.cfg
		if c.GetDomain() != wantDomains[i] {
			t.Errorf("%s: domain %q, want %q", f.name, c.GetDomain(), wantDomains[i])
		}
		if !strings.Contains(strings.Join(rules.Domains(), ","), c.GetDomain()) {
			t.Errorf("%s: domain %q has no rule file in examples/config", f.name, c.GetDomain())
		}
		if prev, dup := stages[c.GetStage()]; dup {
			t.Errorf("%s and %s share stage %d: both would send the route table's rate_limits", prev, f.name, c.GetStage())
		}
		stages[c.GetStage()] = f.name
		svc := c.GetRateLimitService()
		if svc.GetTransportApiVersion() != corev3.ApiVersion_V3 {
			t.Errorf("%s: transport_api_version %v, want V3", f.name, svc.GetTransportApiVersion())
		}
		if got := svc.GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != "sluice" {
			t.Errorf("%s: rate-limit service cluster %q, want sluice", f.name, got)
		}
		if d := c.GetTimeout().AsDuration(); d != 50*time.Millisecond {
			t.Errorf("%s: timeout %v, want 50ms", f.name, d)
		}
		if c.GetFailureModeDeny() {
			t.Errorf("%s: failure_mode_deny true, want false (fail open)", f.name)
		}
		if c.GetEnableXRatelimitHeaders() != ratelimitv3.RateLimit_DRAFT_VERSION_03 {
			t.Errorf("%s: enable_x_ratelimit_headers %v, want DRAFT_VERSION_03", f.name, c.GetEnableXRatelimitHeaders())
		}
		if !c.GetEnableRetryAfterHeader() {
			t.Errorf("%s: enable_retry_after_header off", f.name)
		}
	}

	clusters := map[string]bool{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = true
		if c.GetName() != "sluice" {
			continue
		}
		a := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		if a.GetAddress() != "sluice" || a.GetPortValue() != 8081 {
			t.Errorf("cluster sluice points at %s:%d, want sluice:8081", a.GetAddress(), a.GetPortValue())
		}
		opts := &upstreamhttpv3.HttpProtocolOptions{}
		anyOpts := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
		if anyOpts == nil {
			t.Fatal("cluster sluice has no HttpProtocolOptions: Envoy would speak HTTP/1.1 to a gRPC server")
		}
		if err := anyOpts.UnmarshalTo(opts); err != nil {
			t.Fatal(err)
		}
		if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Error("cluster sluice is not HTTP/2")
		}
	}
	for _, name := range []string{"sluice", "upstream"} {
		if !clusters[name] {
			t.Errorf("no cluster %q", name)
		}
	}
}

// envoyRequest is a downstream request, as far as the rate-limit actions
// of envoy.yaml can see it.
type envoyRequest struct {
	path    string
	ip      string
	headers map[string]string
}

// envoyCall is one ShouldRateLimit call one filter makes.
type envoyCall struct {
	filter string
	req    *rlsv3.RateLimitRequest
}

// envoyModel computes the calls Envoy makes for a request, from the
// parsed bootstrap: a small model of the route table and the rate-limit
// filter, covering what envoy.yaml uses and refusing the rest.
type envoyModel struct {
	t       *testing.T
	vhost   *routev3.VirtualHost
	filters []envoyRateLimitFilter
}

func newEnvoyModel(t *testing.T) *envoyModel {
	bs := loadEnvoyBootstrap(t)
	hcm := envoyHCM(t, bs)
	vhs := hcm.GetRouteConfig().GetVirtualHosts()
	if len(vhs) != 1 {
		t.Fatalf("model handles one virtual host, got %d", len(vhs))
	}
	return &envoyModel{t: t, vhost: vhs[0], filters: envoyRateLimitFilters(t, hcm)}
}

// route returns the first route matching path, as Envoy picks it.
func (m *envoyModel) route(path string) *routev3.Route {
	for _, r := range m.vhost.GetRoutes() {
		switch p := r.GetMatch().GetPathSpecifier().(type) {
		case *routev3.RouteMatch_Path:
			if path == p.Path {
				return r
			}
		case *routev3.RouteMatch_Prefix:
			if strings.HasPrefix(path, p.Prefix) {
				return r
			}
		default:
			m.t.Fatalf("model does not handle route match %T", p)
		}
	}
	m.t.Fatalf("no route for %s", path)
	return nil
}

// calls lists the ShouldRateLimit calls for req, in filter order.
func (m *envoyModel) calls(req envoyRequest) []envoyCall {
	r := m.route(req.path)
	var out []envoyCall
	for _, f := range m.filters {
		domain := f.cfg.GetDomain()
		var policies []*routev3.RateLimit
		perRoute := &ratelimitv3.RateLimitPerRoute{}
		if a := r.GetTypedPerFilterConfig()[f.name]; a != nil {
			if err := a.UnmarshalTo(perRoute); err != nil {
				m.t.Fatalf("route %s, filter %s: %v", req.path, f.name, err)
			}
			if perRoute.GetDomain() != "" {
				domain = perRoute.GetDomain()
			}
		}
		switch {
		case len(perRoute.GetRateLimits()) > 0:
			// Per-route rate_limits win over every other source; stage
			// does not apply to them.
			policies = perRoute.GetRateLimits()
		case len(f.cfg.GetRateLimits()) > 0:
			policies = f.cfg.GetRateLimits()
		default:
			// The route table, filtered by the filter's stage. The virtual
			// host's rate_limits apply when the route has none (OVERRIDE).
			var table []*routev3.RateLimit
			routeLimits := r.GetRoute().GetRateLimits()
			table = append(table, routeLimits...)
			switch perRoute.GetVhRateLimits() {
			case ratelimitv3.RateLimitPerRoute_OVERRIDE:
				if len(routeLimits) == 0 {
					table = append(table, m.vhost.GetRateLimits()...)
				}
			case ratelimitv3.RateLimitPerRoute_INCLUDE:
				table = append(table, m.vhost.GetRateLimits()...)
			}
			for _, p := range table {
				if p.GetStage().GetValue() == f.cfg.GetStage() {
					policies = append(policies, p)
				}
			}
		}
		var ds []*rlv3.RateLimitDescriptor
		for _, p := range policies {
			if d := m.descriptor(p, req); d != nil {
				ds = append(ds, d)
			}
		}
		if len(ds) > 0 {
			out = append(out, envoyCall{f.name, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}})
		}
	}
	return out
}

// descriptor applies one rate_limits entry; nil when an action produces
// no entry (Envoy then sends no descriptor for the entry).
func (m *envoyModel) descriptor(p *routev3.RateLimit, req envoyRequest) *rlv3.RateLimitDescriptor {
	if p.GetLimit() != nil || p.GetDisableKey() != "" || p.GetApplyOnStreamDone() {
		m.t.Fatalf("model does not handle limit, disable_key or apply_on_stream_done")
	}
	d := &rlv3.RateLimitDescriptor{}
	add := func(k, v string) {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	for _, a := range p.GetActions() {
		switch x := a.GetActionSpecifier().(type) {
		case *routev3.RateLimit_Action_RemoteAddress_:
			add("remote_address", req.ip)
		case *routev3.RateLimit_Action_RequestHeaders_:
			v, ok := req.headers[strings.ToLower(x.RequestHeaders.GetHeaderName())]
			switch {
			case ok:
				add(x.RequestHeaders.GetDescriptorKey(), v)
			case x.RequestHeaders.GetSkipIfAbsent():
			default:
				return nil
			}
		case *routev3.RateLimit_Action_GenericKey_:
			k := x.GenericKey.GetDescriptorKey()
			if k == "" {
				k = "generic_key"
			}
			add(k, x.GenericKey.GetDescriptorValue())
		default:
			m.t.Fatalf("model does not handle action %T", x)
		}
	}
	if h := p.GetHitsAddend(); h != nil {
		if h.GetNumber() != nil {
			d.HitsAddend = wrapperspb.UInt64(h.GetNumber().GetValue())
		} else {
			f := h.GetFormat()
			if !strings.HasPrefix(f, "%REQ(") || !strings.HasSuffix(f, ")%") {
				m.t.Fatalf("model handles only %%REQ(header)%% hits_addend formats, got %q", f)
			}
			name := strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(f, "%REQ("), ")%"))
			n, err := strconv.ParseUint(req.headers[name], 10, 64)
			if err != nil || n > 1_000_000_000 {
				// Missing, not a number or over Envoy's cap: the
				// descriptor is ignored.
				return nil
			}
			d.HitsAddend = wrapperspb.UInt64(n)
		}
	}
	if len(d.Entries) == 0 {
		return nil
	}
	return d
}

// envoyStack is envoy.yaml in front of an in-process Sluice with the
// example rules, on a settable clock.
type envoyStack struct {
	t     *testing.T
	model *envoyModel
	svc   *ratelimit.Service
	now   atomic.Int64 // epoch ms
	// last holds the responses of the latest request, by domain.
	last map[string]*rlsv3.RateLimitResponse
}

func newEnvoyStack(t *testing.T) *envoyStack {
	cfg, err := descriptors.Load("config")
	if err != nil {
		t.Fatal(err)
	}
	return newEnvoyStackFor(t, newEnvoyModel(t), cfg)
}

// newEnvoyStackFor puts the Envoy of model in front of Sluice with cfg.
func newEnvoyStackFor(t *testing.T, model *envoyModel, cfg *descriptors.Config) *envoyStack {
	s := &envoyStack{t: t, model: model}
	s.now.Store(1_700_000_000_000)
	be := memory.New(memory.Options{Now: s.now.Load, SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	s.svc = ratelimit.New(envoyStaticRules{cfg}, be, ratelimit.Options{})
	return s
}

type envoyStaticRules struct{ cfg *descriptors.Config }

func (r envoyStaticRules) Current() *descriptors.Config { return r.cfg }

func (s *envoyStack) advance(d time.Duration) { s.now.Add(d.Milliseconds()) }

// do sends req through the filters; it reports whether the request
// reaches the upstream. The first filter that gets OVER_LIMIT answers 429
// and the later ones do not run.
func (s *envoyStack) do(req envoyRequest) bool {
	s.t.Helper()
	s.last = map[string]*rlsv3.RateLimitResponse{}
	for _, c := range s.model.calls(req) {
		resp, err := s.svc.ShouldRateLimit(context.Background(), c.req)
		if err != nil {
			s.t.Fatalf("%s: %v", c.filter, err)
		}
		s.last[c.req.Domain] = resp
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			return false
		}
	}
	return true
}

// allowedRun sends req n times at the current instant; it fails the test
// unless exactly the first want requests pass.
func (s *envoyStack) allowedRun(what string, n, want int, req func(i int) envoyRequest) {
	s.t.Helper()
	for i := range n {
		if got := s.do(req(i)); got != (i < want) {
			s.t.Fatalf("%s: request %d allowed=%v, want the first %d of %d allowed", what, i+1, got, want, n)
		}
	}
}

// overLimitName is the name of the limit that denied the latest request
// in domain, or "" if nothing there was over.
func (s *envoyStack) overLimitName(domain string) string {
	for _, st := range s.last[domain].GetStatuses() {
		if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			return st.GetCurrentLimit().GetName()
		}
	}
	return ""
}

func ip(i int) string { return fmt.Sprintf("203.0.%d.%d", 113+i/250, 1+i%250) }

func TestEnvoyDescriptors(t *testing.T) {
	m := newEnvoyModel(t)
	desc := func(kv ...string) string {
		var b strings.Builder
		for i := 0; i < len(kv); i += 2 {
			fmt.Fprintf(&b, "%s=%s,", kv[i], kv[i+1])
		}
		return strings.TrimSuffix(b.String(), ",")
	}
	show := func(calls []envoyCall) string {
		var parts []string
		for _, c := range calls {
			for _, d := range c.req.Descriptors {
				var kv []string
				for _, e := range d.Entries {
					kv = append(kv, e.Key, e.Value)
				}
				s := c.req.Domain + ":" + desc(kv...)
				if d.HitsAddend != nil {
					s += fmt.Sprintf("+%d", d.HitsAddend.GetValue())
				}
				parts = append(parts, s)
			}
		}
		return strings.Join(parts, " ")
	}
	key := map[string]string{"x-api-key": "k1"}
	for _, tc := range []struct {
		req  envoyRequest
		want string
	}{
		{envoyRequest{"/", "198.51.100.7", nil}, "edge:remote_address=198.51.100.7"},
		{envoyRequest{"/login", "198.51.100.7", nil}, "edge:remote_address=198.51.100.7 edge:generic_key=login"},
		{envoyRequest{"/login/help", "198.51.100.7", nil}, "edge:remote_address=198.51.100.7"},
		{envoyRequest{"/v1/models", "198.51.100.7", key}, "edge:remote_address=198.51.100.7 api:api_key=k1"},
		{envoyRequest{"/v1/models", "198.51.100.7", nil}, "edge:remote_address=198.51.100.7"},
		{envoyRequest{"/v1/chat/completions", "198.51.100.7", map[string]string{"x-api-key": "k1", "x-llm-tokens": "2500"}},
			"edge:remote_address=198.51.100.7 api:api_key=k1 api:api_key=k1,route=chat+2500"},
		// Without a token count Envoy drops the chat descriptor: the
		// header must come from something the client cannot skip.
		{envoyRequest{"/v1/chat/completions", "198.51.100.7", key}, "edge:remote_address=198.51.100.7 api:api_key=k1"},
		{envoyRequest{"/v1/chat/completions", "198.51.100.7", nil}, "edge:remote_address=198.51.100.7"},
	} {
		if got := show(m.calls(tc.req)); got != tc.want {
			t.Errorf("%s %v:\n got %s\nwant %s", tc.req.path, tc.req.headers, got, tc.want)
		}
	}
}

func TestEnvoyWithSluicePerClientIP(t *testing.T) {
	s := newEnvoyStack(t)
	from := func(addr string) func(int) envoyRequest {
		return func(int) envoyRequest { return envoyRequest{path: "/", ip: addr} }
	}
	// 10 a second, a bucket per address.
	s.allowedRun("198.51.100.7", 11, 10, from("198.51.100.7"))
	s.allowedRun("another address", 10, 10, from("198.51.100.8"))
	s.advance(100 * time.Millisecond) // one token back
	s.allowedRun("198.51.100.7 after 100ms", 2, 1, from("198.51.100.7"))
	s.advance(time.Second)
	s.allowedRun("198.51.100.7 after 1s", 11, 10, from("198.51.100.7"))

	// The blocked address never gets through.
	s.allowedRun("192.0.2.66", 3, 0, from("192.0.2.66"))
	s.advance(time.Hour)
	s.allowedRun("192.0.2.66 an hour later", 1, 0, from("192.0.2.66"))

	// The health checker is never limited.
	s.allowedRun("192.0.2.10", 1000, 1000, from("192.0.2.10"))
	if st := s.last["edge"].GetStatuses()[0]; st.GetLimitRemaining() != math.MaxUint32 {
		t.Errorf("192.0.2.10: limit_remaining %d, want unlimited", st.GetLimitRemaining())
	}
}

func TestEnvoyWithSluiceLogin(t *testing.T) {
	s := newEnvoyStack(t)
	// 60 a minute for /login, all clients together: distinct addresses,
	// so the per-IP limit is not what stops them.
	login := func(i int) envoyRequest { return envoyRequest{path: "/login", ip: ip(i)} }
	s.allowedRun("/login", 61, 60, login)
	if got := s.overLimitName("edge"); got != "login" {
		t.Errorf("/login denied by %q, want the login rule", got)
	}
	// Other routes are not affected.
	s.allowedRun("/ beside a spent /login", 1, 1, func(int) envoyRequest { return envoyRequest{path: "/", ip: ip(0)} })
	s.advance(time.Second) // one a second comes back
	s.allowedRun("/login after 1s", 2, 1, func(i int) envoyRequest { return login(100 + i) })
}

func TestEnvoyWithSluiceAPIKey(t *testing.T) {
	s := newEnvoyStack(t)
	withKey := func(k string) func(int) envoyRequest {
		return func(i int) envoyRequest {
			return envoyRequest{path: "/v1/models", ip: ip(i), headers: map[string]string{"x-api-key": k}}
		}
	}
	// 100 a minute with a burst of 120: 120 at once, then one per 600ms.
	s.allowedRun("k1", 121, 120, withKey("k1"))
	if got := s.overLimitName("api"); got != "rpm" {
		t.Errorf("k1 denied by %q, want rpm", got)
	}
	s.allowedRun("k2 beside a spent k1", 120, 120, withKey("k2"))
	s.advance(600 * time.Millisecond)
	s.allowedRun("k1 after 600ms", 2, 1, withKey("k1"))
	// No key, no API limit (only the per-IP one).
	s.allowedRun("no key", 10, 10, func(int) envoyRequest { return envoyRequest{path: "/v1/models", ip: "198.51.100.9"} })
}

func TestEnvoyWithSluiceChat(t *testing.T) {
	s := newEnvoyStack(t)
	chat := func(k string, tokens int) func(int) envoyRequest {
		return func(i int) envoyRequest {
			return envoyRequest{path: "/v1/chat/completions", ip: ip(i), headers: map[string]string{
				"x-api-key": k, "x-llm-tokens": strconv.Itoa(tokens),
			}}
		}
	}
	// Tokens: 40000 a minute, burst 60000. Two requests of 30000 tokens
	// spend the burst; the third is over on tpm.
	s.allowedRun("c1 30000 tokens each", 3, 2, chat("c1", 30000))
	if got := s.overLimitName("api"); got != "tpm" {
		t.Errorf("c1 denied by %q, want tpm", got)
	}
	// The chat descriptor carries its own hits_addend, so the third
	// request's 30000 tokens are a charge (charges: own_hits, the
	// default): denied, they count all the same, as envoyproxy/ratelimit
	// counts them, and the key is 30000 in debt, repaid in 45 s: until
	// then even a small request is denied.
	s.advance(44 * time.Second)
	s.allowedRun("c1 after 44s", 1, 0, chat("c1", 10))
	s.advance(2 * time.Second)
	s.allowedRun("c1 after 46s", 1, 1, chat("c1", 10))
	// A request larger than the burst can never pass.
	s.advance(time.Hour)
	s.allowedRun("c1 over the burst", 1, 0, chat("c1", 60001))

	// Requests: 20 a minute on the chat route, whatever their size.
	s.allowedRun("c2 20/min", 21, 20, chat("c2", 10))
	if got := s.overLimitName("api"); got != "rpm" {
		t.Errorf("c2 denied by %q, want rpm", got)
	}
	// Chat requests count against the key's 100/min too: Sluice decides
	// each descriptor on its own, so all 21 (the denied one included,
	// whose api_key descriptor passed) took one of the key's 120.
	s.allowedRun("c2 elsewhere", 100, 99, func(i int) envoyRequest {
		return envoyRequest{path: "/v1/models", ip: ip(i), headers: map[string]string{"x-api-key": "c2"}}
	})
	s.allowedRun("c2 elsewhere, spent", 1, 0, func(i int) envoyRequest {
		return envoyRequest{path: "/v1/models", ip: ip(i), headers: map[string]string{"x-api-key": "c2"}}
	})
}
