package certs_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/certs"
	"github.com/sluice-rl/sluice/certs/certstest"
)

// noPoll is a Watch interval long enough that only file events reload.
const noPoll = time.Hour

// Each rotation test rotates twice: the first rotation may race with
// Watch setting up its watches (Watch then catches it with its first
// read), the second happens after Watch has reloaded once, so only a file
// event can bring it in.

func TestRotateByRename(t *testing.T) {
	serverCA, clientCA1, clientCA2 := certstest.NewCA(t, "server CA"), certstest.NewCA(t, "client CA 1"), certstest.NewCA(t, "client CA 2")
	dir := t.TempDir()
	f := writeIdentity(t, dir, serverCA.Issue(t, "sluice", true))
	f.ClientCA = filepath.Join(dir, "client-ca.PEM")
	certstest.WriteFile(t, f.ClientCA, clientCA1.PEM)
	r := newReloader(t, f)
	addr := serve(t, r)
	watch(t, r, noPoll)
	client1 := clientConfig(serverCA, clientCA1.Issue(t, "envoy", false).TLSCert(t))
	client2 := clientConfig(serverCA, clientCA2.Issue(t, "envoy", false).TLSCert(t))

	for i := range 2 {
		next := serverCA.Issue(t, fmt.Sprintf("sluice-%d", i), true)
		certstest.WriteFile(t, f.Cert, next.CertPEM)
		certstest.WriteFile(t, f.Key, next.KeyPEM)
		eventually(t, serialIs(t, addr, client1, next.Serial))
		if st := r.Stats(); st.Subject != next.Subject() {
			t.Errorf("stats subject %q, want %q", st.Subject, next.Subject())
		}
	}

	certstest.WriteFile(t, f.ClientCA, clientCA2.PEM)
	eventually(t, func() error {
		_, err := check(t, addr, client2)
		return err
	})
	if _, err := check(t, addr, client1); err == nil {
		t.Error("a client of the replaced client CA is still accepted")
	}
	if st := r.Stats(); st.OK < 4 {
		t.Errorf("stats %+v, want at least 4 OK (New and 3 rotations)", st)
	}
}

// kubeVolume lays files out as the kubelet does for a Secret volume:
// dir/name -> ..data/name, dir/..data -> ..<timestamp>, and an update
// writes a new timestamped directory and renames a new ..data symlink
// over the old one.
type kubeVolume struct {
	dir string
	gen int
}

func (v *kubeVolume) update(t *testing.T, files map[string][]byte) {
	t.Helper()
	v.gen++
	ts := fmt.Sprintf("..2024_01_01_00_00_%02d.%d", v.gen, os.Getpid())
	if err := os.Mkdir(filepath.Join(v.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(v.dir, ts, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(v.dir, "..data"))
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(v.dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(v.dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRotateKubernetesSymlinkSwap(t *testing.T) {
	serverCA, clientCA1, clientCA2 := certstest.NewCA(t, "server CA"), certstest.NewCA(t, "client CA 1"), certstest.NewCA(t, "client CA 2")
	v := &kubeVolume{dir: t.TempDir()}
	first := serverCA.Issue(t, "sluice", true)
	v.update(t, map[string][]byte{"tls.crt": first.CertPEM, "tls.key": first.KeyPEM, "ca.crt": clientCA1.PEM})
	r := newReloader(t, certs.Files{
		Cert:     filepath.Join(v.dir, "tls.crt"),
		Key:      filepath.Join(v.dir, "tls.key"),
		ClientCA: filepath.Join(v.dir, "ca.crt"),
	})
	addr := serve(t, r)
	watch(t, r, noPoll)
	client1 := clientConfig(serverCA, clientCA1.Issue(t, "envoy", false).TLSCert(t))
	client2 := clientConfig(serverCA, clientCA2.Issue(t, "envoy", false).TLSCert(t))
	if got := servedSerial(t, addr, client1); got.Cmp(first.Serial) != 0 {
		t.Fatalf("served serial %x, want %x", got, first.Serial)
	}

	second := serverCA.Issue(t, "sluice", true)
	v.update(t, map[string][]byte{"tls.crt": second.CertPEM, "tls.key": second.KeyPEM, "ca.crt": clientCA1.PEM})
	eventually(t, serialIs(t, addr, client1, second.Serial))

	// The server certificate and the client CA change in one swap.
	third := serverCA.Issue(t, "sluice", true)
	v.update(t, map[string][]byte{"tls.crt": third.CertPEM, "tls.key": third.KeyPEM, "ca.crt": clientCA2.PEM})
	eventually(t, serialIs(t, addr, client2, third.Serial))
	if _, err := check(t, addr, client1); err == nil {
		t.Error("a client of the replaced client CA is still accepted")
	}
	if st := r.Stats(); st.OK != 3 || st.Failed != 0 {
		t.Errorf("stats %+v, want 3 OK and no failure: a swap is atomic", st)
	}
}

// TestPeriodicCheck rotates files that no watched directory sees change:
// the configured paths are symlinks into another directory.
func TestPeriodicCheck(t *testing.T) {
	ca := certstest.NewCA(t, "server CA")
	target, linkDir := t.TempDir(), t.TempDir()
	inTarget := writeIdentity(t, target, ca.Issue(t, "sluice", true))
	f := certs.Files{Cert: filepath.Join(linkDir, "cert.pem"), Key: filepath.Join(linkDir, "key.pem")}
	for link, to := range map[string]string{f.Cert: inTarget.Cert, f.Key: inTarget.Key} {
		if err := os.Symlink(to, link); err != nil {
			t.Fatal(err)
		}
	}
	r := newReloader(t, f)
	addr := serve(t, r)
	watch(t, r, 50*time.Millisecond)

	for i := range 2 {
		next := ca.Issue(t, fmt.Sprintf("sluice-%d", i), true)
		writeIdentity(t, target, next)
		eventually(t, serialIs(t, addr, clientConfig(ca), next.Serial))
	}
}

func TestBadReloadKeepsCertificate(t *testing.T) {
	ca := certstest.NewCA(t, "server CA")
	first := ca.Issue(t, "sluice", true)
	f := writeIdentity(t, t.TempDir(), first)
	r := newReloader(t, f)
	addr := serve(t, r)
	// A short interval, to show that the periodic check does not count a
	// failure again while the files stay the same.
	watch(t, r, 20*time.Millisecond)
	client := clientConfig(ca)

	failedWith := func(n uint64, file string) {
		t.Helper()
		eventually(t, func() error {
			if st := r.Stats(); st.Failed != n || !strings.Contains(st.LastError, file) {
				return fmt.Errorf("stats %+v, want %d failures, the last naming %s", st, n, file)
			}
			return nil
		})
		time.Sleep(100 * time.Millisecond) // a few periodic checks
		if st := r.Stats(); st.Failed != n {
			t.Errorf("%d failures after a few periodic checks, want %d", st.Failed, n)
		}
		if got := servedSerial(t, addr, client); got.Cmp(first.Serial) != 0 {
			t.Errorf("served serial %x after a failed reload, want the previous %x", got, first.Serial)
		}
	}

	certstest.WriteFile(t, f.Cert, []byte("garbage"))
	failedWith(1, f.Cert)

	// A valid certificate whose key has not been written yet.
	second := ca.Issue(t, "sluice", true)
	certstest.WriteFile(t, f.Cert, second.CertPEM)
	failedWith(2, f.Key)

	certstest.WriteFile(t, f.Key, second.KeyPEM)
	eventually(t, serialIs(t, addr, client, second.Serial))
	st := r.Stats()
	if st.OK != 2 || st.Failed != 2 || st.LastError != "" {
		t.Errorf("stats after recovery %+v, want 2 OK, 2 failures and no last error", st)
	}
}

func TestWatchStopsCleanly(t *testing.T) {
	ca := certstest.NewCA(t, "server CA")
	r := newReloader(t, writeIdentity(t, t.TempDir(), ca.Issue(t, "sluice", true)))
	before := runtime.NumGoroutine()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Watch(ctx, 10*time.Millisecond)
	}()
	time.Sleep(50 * time.Millisecond) // let it tick a few times
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Watch did not return after its context was cancelled")
	}
	// fsnotify's reader goroutine must be gone too.
	eventually(t, func() error {
		if n := runtime.NumGoroutine(); n > before {
			return fmt.Errorf("%d goroutines, %d before Watch", n, before)
		}
		return nil
	})
}
