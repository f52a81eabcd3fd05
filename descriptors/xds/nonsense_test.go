package xds_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluice-rl/sluice/descriptors/xds"
)

// handServer is an ADS server the test drives by hand, one stream at a
// time, to send what go-control-plane's server never would: resources of
// another type, bytes that do not decode, silence.
type handServer struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	streams chan *handStream
	addr    string
	grpc    *grpc.Server
}

// handStream is one stream from the client; the server ends it when the
// test sends an error (nil ends it cleanly) on end.
type handStream struct {
	st  discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer
	end chan error
}

func startHandServer(t *testing.T, addr string) *handServer {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &handServer{streams: make(chan *handStream), addr: ln.Addr().String(), grpc: grpc.NewServer()}
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(s.grpc, s)
	go s.grpc.Serve(ln)
	t.Cleanup(s.grpc.Stop)
	return s
}

func (s *handServer) StreamAggregatedResources(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	h := &handStream{st: st, end: make(chan error, 1)}
	select {
	case s.streams <- h:
	case <-st.Context().Done():
		return st.Context().Err()
	}
	select {
	case err := <-h.end:
		return err
	case <-st.Context().Done():
		return st.Context().Err()
	}
}

// next is the next stream the client opens, and its first request.
func (s *handServer) next(t *testing.T) (*handStream, *discoveryv3.DiscoveryRequest) {
	t.Helper()
	select {
	case h := <-s.streams:
		return h, h.recv(t)
	case <-time.After(10 * time.Second):
		t.Fatal("the client opened no stream in 10 s")
		return nil, nil
	}
}

func (h *handStream) recv(t *testing.T) *discoveryv3.DiscoveryRequest {
	t.Helper()
	req, err := h.st.Recv()
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	return req
}

// send sends a response and returns the client's answer to it.
func (h *handStream) send(t *testing.T, resp *discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryRequest {
	t.Helper()
	if err := h.st.Send(resp); err != nil {
		t.Fatalf("send %s: %v", resp.GetVersionInfo(), err)
	}
	req := h.recv(t)
	if req.GetResponseNonce() != resp.GetNonce() {
		t.Fatalf("answer to %s carries nonce %q, want %q", resp.GetVersionInfo(), req.GetResponseNonce(), resp.GetNonce())
	}
	return req
}

func rulesResponse(t *testing.T, version string, cfgs ...*rlconfv3.RateLimitConfig) *discoveryv3.DiscoveryResponse {
	t.Helper()
	resp := &discoveryv3.DiscoveryResponse{VersionInfo: version, Nonce: "n-" + version, TypeUrl: xds.TypeURL}
	for _, c := range cfgs {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		resp.Resources = append(resp.Resources, a)
	}
	return resp
}

func perSecond(domain string, n uint32) *rlconfv3.RateLimitConfig {
	return &rlconfv3.RateLimitConfig{Name: domain, Domain: domain, Descriptors: []*rlconfv3.RateLimitDescriptor{
		{Key: "client", RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_SECOND, RequestsPerUnit: n}}}}
}

// An xDS server that sends garbage, hangs, ends the stream or goes away
// never costs Sluice the last good rules: what does not read is NACKed
// with an error that names it, a silent stream keeps the rules in force,
// and a lost stream or server is reconnected to, naming the version in
// force.
func TestServerTalkingNonsense(t *testing.T) {
	srv := startHandServer(t, "127.0.0.1:0")
	conn, err := grpc.NewClient(srv.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	src, err := xds.Subscribe(ctx, conn, xds.Options{NodeID: "n1", MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}

	h, first := srv.next(t)
	if first.GetTypeUrl() != xds.TypeURL || first.GetNode().GetId() != "n1" || first.GetVersionInfo() != "" {
		t.Fatalf("first request %v", first)
	}
	if ack := h.send(t, rulesResponse(t, "v1", perSecond("gw", 5))); ack.GetErrorDetail() != nil || ack.GetVersionInfo() != "v1" {
		t.Fatalf("v1 answered %v, want an ACK", ack)
	}
	good := src.Current()
	if _, ok := good.Match("gw", descriptor("client", "c")); !ok {
		t.Fatal("v1's rules are not in force")
	}

	otherType, err := anypb.New(&corev3.Node{Id: "not a rate-limit config"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		resp *discoveryv3.DiscoveryResponse
		want []string // in the NACK's message
	}{
		{"a resource of another type", &discoveryv3.DiscoveryResponse{TypeUrl: xds.TypeURL, Resources: []*anypb.Any{otherType}},
			[]string{"resource 0", "envoy.config.core.v3.Node"}},
		{"bytes that do not decode", &discoveryv3.DiscoveryResponse{TypeUrl: xds.TypeURL,
			Resources: []*anypb.Any{{TypeUrl: xds.TypeURL, Value: []byte{0xff, 0xff, 0xff, 0xff}}}},
			[]string{"resource 0", "ratelimit.v3.RateLimitConfig"}},
		{"a response of another type", &discoveryv3.DiscoveryResponse{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster"},
			[]string{"envoy.config.cluster.v3.Cluster", xds.TypeURL}},
		{"a limit without a unit", rulesResponse(t, "", &rlconfv3.RateLimitConfig{Name: "nounit", Domain: "gw", Descriptors: []*rlconfv3.RateLimitDescriptor{
			{Key: "client", RateLimit: &rlconfv3.RateLimitPolicy{RequestsPerUnit: 5}}}}),
			[]string{"xds:nounit", "unit"}},
		{"an unlimited limit with a rate", rulesResponse(t, "", &rlconfv3.RateLimitConfig{Name: "both", Domain: "gw", Descriptors: []*rlconfv3.RateLimitDescriptor{
			{Key: "client", RateLimit: &rlconfv3.RateLimitPolicy{Unlimited: true, Unit: rlconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 5}}}}),
			[]string{"xds:both", "unlimited"}},
		{"an empty domain", rulesResponse(t, "", &rlconfv3.RateLimitConfig{Name: "nodomain"}), []string{"xds:nodomain", "domain"}},
	} {
		c.resp.VersionInfo, c.resp.Nonce = "bad-"+c.name, "n-"+c.name
		nack := h.send(t, c.resp)
		msg := nack.GetErrorDetail().GetMessage()
		if nack.GetErrorDetail() == nil || nack.GetVersionInfo() != "v1" {
			t.Errorf("%s: answered %v, want a NACK naming v1 in force", c.name, nack)
		}
		for _, w := range c.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: NACK %q does not say %q", c.name, msg, w)
			}
		}
		if src.Current() != good {
			t.Fatalf("%s changed the rules in force", c.name)
		}
	}
	if st := src.Stats(); st.OK != 1 || st.Failed != 6 {
		t.Errorf("stats %+v, want 1 taken, 6 refused", st)
	}

	// Silence: the stream stays, and so do the rules; no reconnection.
	select {
	case h2 := <-srv.streams:
		t.Fatalf("the client opened a second stream while the first was open: %v", h2)
	case <-time.After(300 * time.Millisecond):
	}
	if src.Current() != good {
		t.Fatal("the rules changed while the server was silent")
	}

	// The server ends the stream with an error: the client reconnects,
	// naming the version in force, and takes the next rules.
	h.end <- status.Error(codes.Unavailable, "going away")
	h, again := srv.next(t)
	if again.GetVersionInfo() != "v1" || again.GetNode().GetId() != "n1" {
		t.Errorf("request after a lost stream %v, want version v1 and the node", again)
	}
	if src.Current() != good {
		t.Fatal("the rules changed while reconnecting")
	}
	if ack := h.send(t, rulesResponse(t, "v2", perSecond("gw2", 5))); ack.GetErrorDetail() != nil {
		t.Fatalf("v2 answered %v, want an ACK", ack)
	}
	if got := src.Current().Domains(); len(got) != 1 || got[0] != "gw2" {
		t.Fatalf("domains after v2: %v", got)
	}

	// The whole server goes away, connections cut: the rules stay; a
	// server back on the address gets a stream naming v2.
	taken := src.Current()
	srv.grpc.Stop()
	time.Sleep(200 * time.Millisecond)
	if src.Current() != taken {
		t.Fatal("the rules changed while the server was away")
	}
	back := startHandServer(t, srv.addr)
	if _, req := back.next(t); req.GetVersionInfo() != "v2" {
		t.Errorf("request to the server back %v, want version v2", req)
	}
	cancel()
	select {
	case <-src.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the subscription did not stop with its context")
	}
	if src.Current() != taken {
		t.Error("stopping changed the rules")
	}
}

func descriptor(key, value string) *rlv3.RateLimitDescriptor {
	return &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}
}
