package certs_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math/big"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/sluice-rl/sluice/certs"
	"github.com/sluice-rl/sluice/certs/certstest"
)

// writeIdentity writes a server identity to dir/cert.pem and dir/key.pem.
func writeIdentity(t *testing.T, dir string, c certstest.Issued) certs.Files {
	t.Helper()
	f := certs.Files{Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem")}
	certstest.WriteFile(t, f.Cert, c.CertPEM)
	certstest.WriteFile(t, f.Key, c.KeyPEM)
	return f
}

func newReloader(t *testing.T, f certs.Files) *certs.Reloader {
	t.Helper()
	r, err := certs.New(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// watch runs r.Watch until the test ends and checks that it returns.
func watch(t *testing.T, r *certs.Reloader, interval time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Watch(ctx, interval)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Watch did not return after its context was cancelled")
		}
	})
}

// serve starts a gRPC server with the standard health service over TLS
// from r, and returns its address.
func serve(t *testing.T, r *certs.Reloader) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(r.TLSConfig())))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return lis.Addr().String()
}

// clientConfig returns a client config trusting ca and, with a client
// certificate, presenting it. The certificate is sent even when it does
// not chain to a CA the server names (a Go client would not send it then),
// so that the tests exercise the server's verification.
func clientConfig(ca *certstest.CA, clientCert ...tls.Certificate) *tls.Config {
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	cfg := &tls.Config{RootCAs: roots}
	if len(clientCert) > 0 {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &clientCert[0], nil
		}
	}
	return cfg
}

// check calls the health service at addr over a new connection and returns
// the certificate the server presented.
func check(t *testing.T, addr string, cfg *tls.Config) (*x509.Certificate, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var p peer.Peer
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
	if err != nil {
		return nil, err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return nil, fmt.Errorf("health status %v, want SERVING", resp.GetStatus())
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil, fmt.Errorf("peer auth info is %T, want credentials.TLSInfo", p.AuthInfo)
	}
	if np := info.State.NegotiatedProtocol; np != "h2" {
		return nil, fmt.Errorf("negotiated protocol %q, want h2", np)
	}
	return info.State.PeerCertificates[0], nil
}

// servedSerial is check for tests that only care about the serial.
func servedSerial(t *testing.T, addr string, cfg *tls.Config) *big.Int {
	t.Helper()
	cert, err := check(t, addr, cfg)
	if err != nil {
		t.Fatalf("health check: %v", err)
	}
	return cert.SerialNumber
}

// eventually calls f until it returns nil, failing the test with f's last
// error if that takes more than a few seconds.
func eventually(t *testing.T, f func() error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing after 5s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// serialIs returns a condition for eventually: a new connection to addr
// sees a server certificate with the serial want.
func serialIs(t *testing.T, addr string, cfg *tls.Config, want *big.Int) func() error {
	return func() error {
		cert, err := check(t, addr, cfg)
		if err != nil {
			return err
		}
		if cert.SerialNumber.Cmp(want) != 0 {
			return fmt.Errorf("served serial %x, want %x", cert.SerialNumber, want)
		}
		return nil
	}
}
