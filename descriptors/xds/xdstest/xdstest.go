// Package xdstest runs go-control-plane's own xDS server, with its
// snapshot cache, on loopback over mutual TLS, for the tests of rules
// delivered as Envoy Gateway delivers them: never a fake.
//
//	srv := xdstest.Start(t)
//	srv.Set(t, "v1", cfg) // RateLimitConfig resources for NodeID
//	// connect to srv.Addr with srv.ClientCreds, or with the files
//	// srv.CAFile, srv.CertFile and srv.KeyFile, as node NodeID
package xdstest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"path/filepath"
	"sync"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluice-rl/sluice/certs/certstest"
)

// NodeID is the node the snapshots are for.
const NodeID = "sluice-test"

// Server is a running xDS server. It lives until the test ends.
type Server struct {
	// Addr is where it listens.
	Addr string
	// CAFile, CertFile and KeyFile are the CA that signed the server's
	// certificate, and a client certificate and key it accepts.
	CAFile, CertFile, KeyFile string
	// ClientCreds connect to it with that client certificate.
	ClientCreds credentials.TransportCredentials

	serverCreds credentials.TransportCredentials
	cache       cachev3.SnapshotCache
	grpc        *grpc.Server

	mu   sync.Mutex
	reqs []*discoveryv3.DiscoveryRequest
}

// Start starts a server on a free loopback port.
func Start(t testing.TB) *Server {
	t.Helper()
	dir := t.TempDir()
	s := &Server{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "sluice.pem"), KeyFile: filepath.Join(dir, "sluice-key.pem")}
	s.newIdentity(t)
	s.serve(t, "127.0.0.1:0")
	return s
}

// newIdentity makes a CA, the server's certificate and a client's, and
// writes the CA and the client's to the Server's files.
func (s *Server) newIdentity(t testing.TB) {
	t.Helper()
	ca := certstest.NewCA(t, "xds-ca")
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	client := ca.Issue(t, "sluice", false)
	certstest.WriteFile(t, s.CAFile, ca.PEM)
	certstest.WriteFile(t, s.CertFile, client.CertPEM)
	certstest.WriteFile(t, s.KeyFile, client.KeyPEM)
	s.ClientCreds = credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{client.TLSCert(t)}, RootCAs: pool, ServerName: "localhost"})
	s.serverCreds = credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "localhost", true).TLSCert(t)},
		ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert})
}

// serve starts serving on addr with an empty snapshot cache.
func (s *Server) serve(t testing.TB, addr string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s.cache = cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.reqs = append(s.reqs, r)
		return nil
	}}
	g := grpc.NewServer(grpc.Creds(s.serverCreds))
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(context.Background(), s.cache, cb))
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	s.grpc, s.Addr = g, ln.Addr().String()
}

// Stop stops the server, as one that goes away: its streams end.
func (s *Server) Stop() { s.grpc.Stop() }

// Restart serves again where it served, with no snapshot.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.serve(t, s.Addr)
}

// Rotate replaces every certificate with ones of a new CA, writing the
// client's files anew as a rotation of Envoy Gateway's Secret does, and
// serves again where it served, with no snapshot: streams end, and a
// client that still holds the old CA or certificate cannot connect.
func (s *Server) Rotate(t testing.TB) {
	t.Helper()
	s.Stop()
	s.newIdentity(t)
	s.serve(t, s.Addr)
}

// Set makes cfgs, as version, the snapshot for NodeID.
func (s *Server) Set(t testing.TB, version string, cfgs ...*rlconfv3.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{resourcev3.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), NodeID, snap); err != nil {
		t.Fatal(err)
	}
}

// Acked reports whether a client ACKed version.
func (s *Server) Acked(version string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.reqs {
		if r.GetResponseNonce() != "" && r.GetErrorDetail() == nil && r.GetVersionInfo() == version {
			return true
		}
	}
	return false
}

// Nacks returns the NACKs clients sent, oldest first.
func (s *Server) Nacks() []*discoveryv3.DiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*discoveryv3.DiscoveryRequest
	for _, r := range s.reqs {
		if r.GetErrorDetail() != nil {
			out = append(out, r)
		}
	}
	return out
}
