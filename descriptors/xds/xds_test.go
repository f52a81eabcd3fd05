package xds_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/sluice-rl/sluice/descriptors/corpustest"
	"github.com/sluice-rl/sluice/descriptors/xds"
	"github.com/sluice-rl/sluice/descriptors/xds/xdstest"
)

// egSnapshot is Envoy Gateway's rate-limit configs from the corpus, as the
// resources it sends.
func egSnapshot(t *testing.T) []*rlconfv3.RateLimitConfig {
	t.Helper()
	dir := corpustest.Dir(t)
	var out []*rlconfv3.RateLimitConfig
	for _, f := range corpustest.Files(t, dir) {
		if f.Repo != "envoyproxy/gateway" || f.Valid != "yes" || !strings.Contains(f.Name, "ratelimit-config") {
			continue
		}
		for _, data := range corpustest.Read(t, dir, f.Name) {
			c, ok := corpustest.RateLimitConfig(t, data)
			if !ok {
				t.Fatalf("%s is not a RateLimitConfig", f.Name)
			}
			// Envoy Gateway's test dumps reuse listener names; one snapshot
			// holds one config per domain.
			c.Domain = c.GetDomain() + "-" + strings.TrimSuffix(filepath.Base(f.Name), ".yaml")[len("envoyproxy__gateway__internal__xds__translator__testdata__out__ratelimit-config__"):]
			c.Name = c.Domain
			out = append(out, c)
		}
	}
	if len(out) < 5 {
		t.Fatalf("only %d Envoy Gateway configs in the corpus", len(out))
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// A Source subscribed to go-control-plane's xDS server over mTLS takes
// Envoy Gateway's rate-limit configs as its rules and ACKs them; a
// snapshot that does not read is NACKed with its error and the rules stay;
// a good one replaces them whole; while the server is gone the rules keep
// serving, and once it is back the Source reconnects and takes what it
// has.
func TestSubscribe(t *testing.T) {
	srv := xdstest.Start(t)
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(srv.ClientCreds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	src, err := xds.Subscribe(ctx, conn, xds.Options{NodeID: xdstest.NodeID, MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if got := src.Current().Domains(); len(got) != 0 {
		t.Fatalf("rules before any snapshot: %v", got)
	}

	eg := egSnapshot(t)
	srv.Set(t, "v1", eg...)
	select {
	case <-src.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("no rules 10 s after the first snapshot")
	}
	if got := len(src.Current().Domains()); got != len(eg) {
		t.Fatalf("%d domains in force, the snapshot has %d", got, len(eg))
	}
	waitFor(t, "the ACK of v1", func() bool { return srv.Acked("v1") })
	first := eg[0]
	if m, ok := src.Current().Match(first.GetDomain(), matchAll(first)); !ok || len(m.Rule.Limits) == 0 {
		t.Fatalf("Envoy Gateway's first rule does not match over xDS: %v %+v", ok, m)
	}

	// A snapshot with a bad unit and a duplicate domain: NACKed, naming
	// both; the rules in force do not change.
	bad := &rlconfv3.RateLimitConfig{Name: "broken", Domain: first.GetDomain(), Descriptors: []*rlconfv3.RateLimitDescriptor{
		{Key: "k", RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_UNKNOWN, RequestsPerUnit: 5}}}}
	before := src.Current()
	srv.Set(t, "v2", append(append([]*rlconfv3.RateLimitConfig{}, eg...), bad)...)
	waitFor(t, "the NACK of v2", func() bool { return len(srv.Nacks()) > 0 })
	nack := srv.Nacks()[0]
	for _, want := range []string{"xds:broken", `invalid unit "unknown"`, "duplicate domain"} {
		if !strings.Contains(nack.GetErrorDetail().GetMessage(), want) {
			t.Errorf("NACK %q does not say %q", nack.GetErrorDetail().GetMessage(), want)
		}
	}
	if nack.GetVersionInfo() != "v1" {
		t.Errorf("NACK reports version %q in force, want v1", nack.GetVersionInfo())
	}
	if src.Current() != before || src.Stats().Failed != 1 {
		t.Errorf("a refused snapshot changed the rules (%d failed)", src.Stats().Failed)
	}
	// The server sends the bad snapshot again after each NACK; the NACKs
	// slow down (to one per MaxBackoff, 100 ms here) instead of spinning.
	time.Sleep(600 * time.Millisecond)
	if n := len(srv.Nacks()); n > 12 {
		t.Errorf("%d NACKs of one bad snapshot in 0.6 s: the client and the server spin", n)
	}
	if src.Stats().Failed != 1 {
		t.Errorf("one bad snapshot counted %d times", src.Stats().Failed)
	}

	// A good snapshot replaces the rules whole.
	srv.Set(t, "v3", eg[:1]...)
	waitFor(t, "v3 in force", func() bool { return len(src.Current().Domains()) == 1 })

	// The server goes away: the rules stay. It comes back on the same
	// address with a new snapshot: the Source reconnects and takes it.
	srv.Stop()
	time.Sleep(300 * time.Millisecond)
	if len(src.Current().Domains()) != 1 {
		t.Fatal("the rules changed while the server was away")
	}
	srv.Restart(t)
	srv.Set(t, "v4", eg[1:3]...)
	waitFor(t, "v4 in force after the server came back", func() bool { return len(src.Current().Domains()) == 2 })
	if st := src.Stats(); st.OK != 3 || st.Failed != 1 {
		t.Errorf("stats %+v, want 3 taken and 1 refused", st)
	}
	cancel()
	<-src.Done()
}

// matchAll is a request descriptor that walks c's first rule path to its
// first limited node, taking each node's value (or "x" for a bare key).
func matchAll(c *rlconfv3.RateLimitConfig) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for ds := c.GetDescriptors(); len(ds) > 0; ds = ds[0].GetDescriptors() {
		v := ds[0].GetValue()
		if v == "" || strings.Contains(v, "*") {
			v = "x"
		}
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: ds[0].GetKey(), Value: v})
		if ds[0].GetRateLimit() != nil {
			break
		}
	}
	return d
}
