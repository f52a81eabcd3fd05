package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/sluice-rl/sluice/descriptors/xds/xdstest"
)

// xdsOptions are serve's options for rules from x, over mutual TLS.
func xdsOptions(x *xdstest.Server) serveOptions {
	o := testOptions(filepath.Join("no", "such", "dir")) // not read with --xds-server
	o.xdsServer, o.xdsNodeID = x.Addr, xdstest.NodeID
	o.xdsCA, o.xdsCert, o.xdsKey = x.CAFile, x.CertFile, x.KeyFile
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
	x := xdstest.Start(t)
	go func() {
		time.Sleep(300 * time.Millisecond)
		x.Set(t, "v1", perMinute("gw", 2))
	}()
	start := time.Now()
	s, _, _ := startTestServer(t, xdsOptions(x))
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
	x.Set(t, "v2", perMinute("gw2", 5))
	waitUntil(t, 10*time.Second, "the second snapshot in force", func() bool {
		resp, err := ask(c, "gw2", "client", "c1")
		return err == nil && resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() == 5
	})
	if v := s.describe(); v.Reloads.OK != 2 || len(v.Domains) != 1 || v.Domains[0] != "gw2" {
		t.Errorf("/debug/config after two snapshots: reloads %+v, domains %v", v.Reloads, v.Domains)
	}

	// Told to start without rules: serving at once, limiting nothing.
	y := xdstest.Start(t)
	o := xdsOptions(y)
	o.xdsStartWithoutRules = true
	s2, _, _ := startTestServer(t, o)
	resp, err := ask(dial(t, s2.grpcLn.Addr().String()), "gw", "client", "c1")
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
		t.Errorf("before any rules: %v %v, want OK and no limit", resp, err)
	}
}

// Envoy Gateway rotates the certificates its rate-limit pod and its xDS
// server use: after a rotation to a new CA, Sluice reconnects with the
// new files and takes the next rules, keeping the old ones meanwhile.
func TestServeXDSAfterCertificateRotation(t *testing.T) {
	x := xdstest.Start(t)
	x.Set(t, "v1", perMinute("gw", 2))
	s, _, _ := startTestServer(t, xdsOptions(x))
	c := dial(t, s.grpcLn.Addr().String())
	if resp, err := ask(c, "gw", "client", "c1"); err != nil || resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 2 {
		t.Fatalf("before the rotation: %v %v", resp, err)
	}
	x.Rotate(t)
	x.Set(t, "v2", perMinute("gw", 7))
	waitUntil(t, 20*time.Second, "the rules sent after the rotation in force", func() bool {
		resp, err := ask(c, "gw", "client", "c1")
		if err != nil || resp.Statuses[0].GetCurrentLimit() == nil {
			t.Fatalf("the old rules were dropped meanwhile: %v %v", resp, err)
		}
		return resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() == 7
	})
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
