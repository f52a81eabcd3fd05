package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluice-rl/sluice/certs/certstest"
)

// An xDS server over mutual TLS, as Envoy Gateway runs one for its
// rate-limit pods: go-control-plane's own, with a snapshot cache. The
// client's certificate and the CA go to files, for the flags.
type testXDS struct {
	addr              string
	cache             cachev3.SnapshotCache
	caFile, cert, key string
}

func startTestXDS(t *testing.T) *testXDS {
	t.Helper()
	dir := t.TempDir()
	ca := certstest.NewCA(t, "xds-ca")
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	x := &testXDS{caFile: filepath.Join(dir, "ca.pem"), cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)}
	certstest.WriteFile(t, x.caFile, ca.PEM)
	x.cert, x.key = ca.Issue(t, "sluice", false).Write(t, dir)
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "localhost", true).TLSCert(t)},
		ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(creds))
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(context.Background(), x.cache, nil))
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	x.addr = ln.Addr().String()
	return x
}

func (x *testXDS) set(t *testing.T, version string, cfgs ...*rlconfv3.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{resourcev3.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.cache.SetSnapshot(context.Background(), "sluice-test", snap); err != nil {
		t.Fatal(err)
	}
}

func (x *testXDS) options() serveOptions {
	o := testOptions(filepath.Join("no", "such", "dir")) // not read with --xds-server
	o.xdsServer, o.xdsNodeID = x.addr, "sluice-test"
	o.xdsCA, o.xdsCert, o.xdsKey = x.caFile, x.cert, x.key
	return o
}

func perMinute(domain string, n uint32) *rlconfv3.RateLimitConfig {
	return &rlconfv3.RateLimitConfig{Name: "gw", Domain: domain, Descriptors: []*rlconfv3.RateLimitDescriptor{
		{Key: "client", RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: n}}}}
}

// sluice serve --xds-server waits for the first rules from the xDS server
// (over mutual TLS), serves them, and takes a new snapshot as a file
// reload; with --xds-start-without-rules it serves at once, limiting
// nothing until rules arrive.
func TestServeRulesFromXDS(t *testing.T) {
	x := startTestXDS(t)
	go func() {
		time.Sleep(300 * time.Millisecond)
		x.set(t, "v1", perMinute("gw", 2))
	}()
	start := time.Now()
	s, _, _ := startTestServer(t, x.options())
	if waited := time.Since(start); waited < 250*time.Millisecond {
		t.Errorf("serving %v after start, before the xDS server had rules", waited)
	}
	c := dial(t, s.grpcLn.Addr().String())
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := ask(c, "gw", "client", "c1")
		if err != nil || resp.OverallCode != want || resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 2 {
			t.Fatalf("call %d: %v %v, want %v under 2/minute", i+1, resp, err, want)
		}
	}
	x.set(t, "v2", perMinute("gw2", 5))
	waitUntil(t, 10*time.Second, "the second snapshot in force", func() bool {
		resp, err := ask(c, "gw2", "client", "c1")
		return err == nil && resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() == 5
	})
	if v := s.describe(); v.Reloads.OK != 2 || len(v.Domains) != 1 || v.Domains[0] != "gw2" {
		t.Errorf("/debug/config after two snapshots: reloads %+v, domains %v", v.Reloads, v.Domains)
	}

	// Told to start without rules: serving at once, limiting nothing.
	y := startTestXDS(t)
	o := y.options()
	o.xdsStartWithoutRules = true
	s2, _, _ := startTestServer(t, o)
	resp, err := ask(dial(t, s2.grpcLn.Addr().String()), "gw", "client", "c1")
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
		t.Errorf("before any rules: %v %v, want OK and no limit", resp, err)
	}
}

// The xDS flags say what is missing or wrong.
func TestServeXDSFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--xds-server", "127.0.0.1:1"}, "--xds-node-id"},
		{[]string{"--xds-server", "127.0.0.1:1", "--xds-node-id", "n", "--xds-tls-cert", "c.pem", "--xds-tls-key", "k.pem"}, "--xds-tls-ca"},
		{[]string{"--xds-server", "127.0.0.1:1", "--xds-node-id", "n", "--xds-tls-ca", "/no/such/ca.pem"}, "--xds-tls-ca"},
	} {
		out, code := sluice(t, append([]string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", ""}, c.args...)...)
		if code == 0 || !strings.Contains(out, c.want) {
			t.Errorf("serve %v: exit %d, want an error naming %s:\n%s", c.args, code, c.want, out)
		}
	}
}
