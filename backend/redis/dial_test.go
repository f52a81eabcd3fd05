package redis

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
	"github.com/sluice-rl/sluice/certs/certstest"
)

func dialOK(t *testing.T, c Conn) {
	t.Helper()
	client, err := Dial(context.Background(), c)
	if err != nil {
		t.Fatalf("%+v: %v", c, err)
	}
	client.Close()
}

func dialFails(t *testing.T, c Conn, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	client, err := Dial(ctx, c)
	if err == nil {
		client.Close()
		t.Fatalf("%+v: connected", c)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("%+v: %v, want an error saying %q", c, err, want)
	}
}

// TLS to a real redis-server: the server's chain is verified against the
// system's roots plus --redis-tls-ca, its name against the URL's host
// unless told otherwise, and a client certificate goes with its key.
func TestDialTLS(t *testing.T) {
	dir := t.TempDir()
	ca := certstest.NewCA(t, "redis-ca")
	caFile := filepath.Join(dir, "ca.pem")
	certstest.WriteFile(t, caFile, ca.PEM)
	cert, key := ca.Issue(t, "redis", true).Write(t, dir) // for localhost and 127.0.0.1
	clientCert, clientKey := ca.Issue(t, "sluice", false).Write(t, dir)
	other := certstest.NewCA(t, "other-ca")
	otherFile := filepath.Join(dir, "other.pem")
	certstest.WriteFile(t, otherFile, other.PEM)
	srv := redistest.RequireWith(t, redistest.Options{
		TLS: &redistest.TLSFiles{Cert: cert, Key: key, CA: caFile},
		// 127.0.0.2 too: an address the certificate does not name.
		Config: []string{"bind", "127.0.0.1 127.0.0.2"},
	})
	port := srv.Addr()[strings.LastIndexByte(srv.Addr(), ':'):]
	named, unnamed := "rediss://127.0.0.1"+port, "rediss://127.0.0.2"+port

	dialOK(t, Conn{URL: named, CAFile: caFile})
	dialOK(t, Conn{URL: named, CAFile: caFile, CertFile: clientCert, KeyFile: clientKey})
	dialFails(t, Conn{URL: named}, "certificate signed by unknown authority")
	dialFails(t, Conn{URL: named, CAFile: otherFile}, "certificate signed by unknown authority")
	dialFails(t, Conn{URL: unnamed, CAFile: caFile}, "127.0.0.2")
	dialOK(t, Conn{URL: unnamed, CAFile: caFile, SkipHostnameVerification: true})
	// Skipping the name still verifies the chain.
	dialFails(t, Conn{URL: unnamed, CAFile: otherFile, SkipHostnameVerification: true}, "unknown authority")
	// The files alone turn TLS on for a redis:// URL.
	dialOK(t, Conn{URL: "redis://127.0.0.1" + port, CAFile: caFile})
	dialFails(t, Conn{URL: named, CAFile: caFile, CertFile: clientCert}, "needs its key")
	dialFails(t, Conn{URL: named, CAFile: filepath.Join(dir, "missing.pem")}, "missing.pem")
}

// A password from the URL, from Conn.Password (SLUICE_REDIS_PASSWORD), or
// from a file read at every connection, so that a rotated secret is used
// from the next reconnection on; no error message shows the password.
func TestDialPassword(t *testing.T) {
	srv := redistest.RequireWith(t, redistest.Options{Password: "first-s3cret"})
	dir := t.TempDir()
	file := filepath.Join(dir, "password")
	if err := os.WriteFile(file, []byte("first-s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dialFails(t, Conn{URL: srv.URL()}, "NOAUTH")
	dialOK(t, Conn{URL: "redis://:first-s3cret@" + srv.Addr()})
	dialOK(t, Conn{URL: srv.URL(), Password: "first-s3cret"})
	dialFails(t, Conn{URL: srv.URL(), Password: "first-s3cret", PasswordFile: file}, "one too many")

	client, err := Dial(context.Background(), Conn{URL: srv.URL(), PasswordFile: file})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// The secret rotates: the server's password and the file change, and
	// the server drops its connections.
	if err := os.WriteFile(file, []byte("default:second-s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := srv.SetPassword(context.Background(), "second-s3cret"); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := client.Do(ctx, client.B().Ping().Build()).Error()
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no PING answered within 2 s of the rotation: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Errors name the server without its password.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := Dial(ctx, Conn{URL: "redis://:hunter2@127.0.0.1:1"}); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error %v shows the password", err)
	}
	if _, err := Dial(ctx, Conn{URL: "redis://:hunter2@[::1"}); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error %v shows the password", err)
	}
}

// Through a Sentinel: the URL names the Sentinel and the primary's name,
// and the decisions land in the primary the Sentinel names.
func TestDialSentinel(t *testing.T) {
	primary := redistest.Require(t)
	sentinel := redistest.RequireWith(t, redistest.Options{Sentinel: &redistest.Sentinel{Name: "mymaster", Primary: primary}})
	client, err := Dial(context.Background(), Conn{URL: "redis://" + sentinel.Addr() + "?master_set=mymaster"})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	b := newBackend(t, client, Options{})
	d, err := b.Decide(context.Background(), &backend.Request{Entity: "e", Resource: "r", Hits: 1,
		Defaults: []bucket.Limit{{Name: "rps", Amount: 5 * bucket.Milli, Period: bucket.Second, Burst: 5 * bucket.Milli}}})
	if err != nil || !d.Allowed {
		t.Fatalf("decision through the Sentinel: %+v, %v", d, err)
	}
	if n, err := primary.Do(context.Background(), "DBSIZE"); err != nil || n != "1" {
		t.Fatalf("the primary holds %s keys (%v), want the bucket", n, err)
	}
}
