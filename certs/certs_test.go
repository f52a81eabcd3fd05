package certs_test

import (
	"crypto/tls"
	"errors"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/certs"
	"github.com/sluice-rl/sluice/certs/certstest"
)

func TestGRPCHealthOverTLS(t *testing.T) {
	ca := certstest.NewCA(t, "server CA")
	srvCert := ca.Issue(t, "sluice", true)
	r := newReloader(t, writeIdentity(t, t.TempDir(), srvCert))
	addr := serve(t, r)

	if got := servedSerial(t, addr, clientConfig(ca)); got.Cmp(srvCert.Serial) != 0 {
		t.Fatalf("served serial %x, want %x", got, srvCert.Serial)
	}
	st := r.Stats()
	if st.OK != 1 || st.Failed != 0 || st.LastError != "" {
		t.Errorf("stats after New = %+v, want 1 OK and no failure", st)
	}
	if st.Subject != "CN=sluice" || st.NotAfter.IsZero() {
		t.Errorf("stats describe %q expiring %v, want CN=sluice and a NotAfter", st.Subject, st.NotAfter)
	}
}

func TestMutualTLS(t *testing.T) {
	serverCA, clientCA, otherCA := certstest.NewCA(t, "server CA"), certstest.NewCA(t, "client CA"), certstest.NewCA(t, "other CA")
	dir := t.TempDir()
	f := writeIdentity(t, dir, serverCA.Issue(t, "sluice", true))
	f.ClientCA = filepath.Join(dir, "client-ca.PEM")
	certstest.WriteFile(t, f.ClientCA, clientCA.PEM)
	addr := serve(t, newReloader(t, f))

	good := clientConfig(serverCA, clientCA.Issue(t, "envoy", false).TLSCert(t))
	if _, err := check(t, addr, good); err != nil {
		t.Errorf("client with a certificate of the client CA: %v", err)
	}
	for name, cfg := range map[string]*tls.Config{
		"no certificate":             clientConfig(serverCA),
		"certificate of another CA":  clientConfig(serverCA, otherCA.Issue(t, "intruder", false).TLSCert(t)),
		"server CA is not client CA": clientConfig(serverCA, serverCA.Issue(t, "intruder", false).TLSCert(t)),
	} {
		_, err := check(t, addr, cfg)
		if code := status.Code(err); code != codes.Unavailable {
			t.Errorf("client with %s: error %v (code %v), want the handshake to fail (Unavailable)", name, err, code)
		}
	}
	// The failures above were the handshakes', not a server gone.
	if _, err := check(t, addr, good); err != nil {
		t.Errorf("client with a certificate of the client CA, after the failures: %v", err)
	}
}

// TestTLSConfigWithoutGRPC checks the config on its own: grpc adds h2 to
// the configs it is given, a plain TLS server does not.
func TestTLSConfigWithoutGRPC(t *testing.T) {
	ca := certstest.NewCA(t, "server CA")
	r := newReloader(t, writeIdentity(t, t.TempDir(), ca.Issue(t, "sluice", true)))

	handshake := func(server, client *tls.Config) (tls.ConnectionState, error) {
		t.Helper()
		ln, err := tls.Listen("tcp", "127.0.0.1:0", server)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		accepted := make(chan struct{})
		go func() {
			defer close(accepted)
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}()
		defer func() { <-accepted }()
		conn, err := tls.Dial("tcp", ln.Addr().String(), client)
		if err != nil {
			return tls.ConnectionState{}, err
		}
		defer conn.Close()
		return conn.ConnectionState(), nil
	}

	client := clientConfig(ca)
	client.NextProtos = []string{"h2"}
	st, err := handshake(r.TLSConfig(), client)
	if err != nil {
		t.Fatal(err)
	}
	if st.NegotiatedProtocol != "h2" {
		t.Errorf("negotiated protocol %q, want h2", st.NegotiatedProtocol)
	}

	// Fields set on the returned config before use reach the handshake.
	server := r.TLSConfig()
	server.NextProtos = []string{"h2", "http/1.1"}
	client.NextProtos = []string{"http/1.1"}
	if st, err = handshake(server, client); err != nil {
		t.Fatal(err)
	}
	if st.NegotiatedProtocol != "http/1.1" {
		t.Errorf("negotiated protocol %q, want http/1.1", st.NegotiatedProtocol)
	}

	old := clientConfig(ca)
	old.MaxVersion = tls.VersionTLS11
	if _, err := handshake(r.TLSConfig(), old); err == nil {
		t.Error("a TLS 1.1 client connected, want TLS 1.2 at least")
	}
}

func TestNewErrorsNameTheFile(t *testing.T) {
	ca := certstest.NewCA(t, "server CA")
	dir := t.TempDir()
	good := writeIdentity(t, dir, ca.Issue(t, "sluice", true))
	otherKey := filepath.Join(dir, "other-key.pem")
	certstest.WriteFile(t, otherKey, ca.Issue(t, "other", true).KeyPEM)
	garbage := filepath.Join(dir, "garbage.pem")
	certstest.WriteFile(t, garbage, []byte("not a certificate\n"))
	keyOnly := filepath.Join(dir, "key-only.pem")
	certstest.WriteFile(t, keyOnly, ca.Issue(t, "other", true).KeyPEM)
	empty := filepath.Join(dir, "empty.pem")
	certstest.WriteFile(t, empty, nil)
	missing := filepath.Join(dir, "missing.pem")

	for _, tc := range []struct {
		name     string
		files    certs.Files
		file     string // the error must name it
		want     string // and say this
		notExist bool
	}{
		{"missing cert", certs.Files{Cert: missing, Key: good.Key}, missing, "read certificate", true},
		{"missing key", certs.Files{Cert: good.Cert, Key: missing}, missing, "read key", true},
		{"missing client CA", certs.Files{Cert: good.Cert, Key: good.Key, ClientCA: missing}, missing, "read client CA", true},
		{"cert not PEM", certs.Files{Cert: garbage, Key: good.Key}, garbage, "no PEM CERTIFICATE block", false},
		{"key not PEM", certs.Files{Cert: good.Cert, Key: garbage}, garbage, "no PEM block of a private key", false},
		{"key given as cert", certs.Files{Cert: good.Key, Key: good.Key}, good.Key, "no PEM CERTIFICATE block", false},
		{"mismatched key", certs.Files{Cert: good.Cert, Key: otherKey}, otherKey, "private key does not match public key", false},
		{"client CA without certificate", certs.Files{Cert: good.Cert, Key: good.Key, ClientCA: keyOnly}, keyOnly, "no PEM CERTIFICATE block", false},
		{"empty client CA", certs.Files{Cert: good.Cert, Key: good.Key, ClientCA: empty}, empty, "empty", false},
		{"no key file given", certs.Files{Cert: good.Cert}, "", "key file", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := certs.New(tc.files, nil)
			if err == nil {
				t.Fatal("New succeeded")
			}
			if !strings.Contains(err.Error(), tc.file) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to name %s and say %q", err, tc.file, tc.want)
			}
			if got := errors.Is(err, fs.ErrNotExist); got != tc.notExist {
				t.Errorf("errors.Is(err, fs.ErrNotExist) = %v, want %v", got, tc.notExist)
			}
		})
	}
}

// A client config from a Reloader presents the client certificate in
// force and verifies the server against the CA bundle in force, so a
// reconnecting client follows a rotation of both (Envoy Gateway rotates
// the certificates its rate-limit pod dials its xDS server with).
func TestClientTLSConfigFollowsRotation(t *testing.T) {
	oldCA, newCA, otherCA := certstest.NewCA(t, "old CA"), certstest.NewCA(t, "new CA"), certstest.NewCA(t, "other CA")
	// A server of each CA, requiring client certificates of its own CA;
	// the other CA's server takes any client, so that only the client's
	// verification can refuse it.
	server := func(ca *certstest.CA, mutual bool) string {
		dir := t.TempDir()
		f := writeIdentity(t, dir, ca.Issue(t, "xds", true))
		if mutual {
			f.ClientCA = filepath.Join(dir, "ca.pem")
			certstest.WriteFile(t, f.ClientCA, ca.PEM)
		}
		return serve(t, newReloader(t, f))
	}
	oldServer, newServer, otherServer := server(oldCA, true), server(newCA, true), server(otherCA, false)

	dir := t.TempDir()
	identity := func(ca *certstest.CA) certs.Files {
		f := writeIdentity(t, dir, ca.Issue(t, "sluice", false))
		f.ClientCA = filepath.Join(dir, "ca.pem")
		certstest.WriteFile(t, f.ClientCA, ca.PEM)
		return f
	}
	r := newReloader(t, identity(oldCA))
	cfg := r.ClientTLSConfig()
	if _, err := check(t, oldServer, cfg); err != nil {
		t.Fatalf("the old CA's server: %v", err)
	}
	for name, addr := range map[string]string{"the new CA's server": newServer, "another CA's server": otherServer} {
		if _, err := check(t, addr, cfg); status.Code(err) != codes.Unavailable {
			t.Errorf("%s, before the rotation: %v, want the handshake to fail", name, err)
		}
	}

	identity(newCA)
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := check(t, newServer, cfg); err != nil {
		t.Errorf("the new CA's server, after the rotation: %v", err)
	}
	for name, addr := range map[string]string{"the old CA's server": oldServer, "another CA's server": otherServer} {
		if _, err := check(t, addr, cfg); status.Code(err) != codes.Unavailable {
			t.Errorf("%s, after the rotation: %v, want the handshake to fail", name, err)
		}
	}
	// The name dialled is verified too: the server's certificate is for
	// localhost and 127.0.0.1, not for this name.
	wrongName := cfg.Clone()
	wrongName.ServerName = "xds.example"
	if _, err := check(t, newServer, wrongName); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "xds.example") {
		t.Errorf("a server certificate for another name: %v, want the handshake to fail naming it", err)
	}
}
