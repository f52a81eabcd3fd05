package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rl/sluice/backend/redis/redistest"
)

// lockedBuffer is a bytes.Buffer safe for a command writing while a
// test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestSyncMovesSharesOnRedis: two regions, each on a Redis database of
// its own, with a replica (serve) and a sync each, 2 s windows. Traffic
// for a global rule in us only: within a few windows `sluice shares`
// shows us holding the whole limit and eu none, the replica in us
// admits more than its base, the syncs' /metrics count their rounds and
// writes and show the key's shares, and every metric they serve is in
// docs/metrics.md's table of them. A sync's bad flags are usage errors.
func TestSyncMovesSharesOnRedis(t *testing.T) {
	srv := redistest.Require(t)
	dir := t.TempDir()
	rules := "domain: api\ndescriptors:\n  - key: tenant\n    global: true\n    limits: [{name: rps, rate: 100/s}]\n"
	if err := os.WriteFile(filepath.Join(dir, "api.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	url := map[string]string{"us": "redis://" + srv.Addr() + "/0", "eu": "redis://" + srv.Addr() + "/1"}
	clock := []string{"--global-regions", "us=1,eu=1", "--global-window", "2s", "--global-skew", "100ms", "--global-hold", "200ms"}
	syncArgs := func(me, other string) []string {
		return append([]string{"sync", "--backend", "redis", "--redis-url", url[me], "--key-prefix", "g", "--global-region", me,
			"--global-store", other + "=" + url[other]}, clock...)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sync", "--backend", "redis", "--redis-url", url["us"], "--global-region", "us"}, "--global-regions"},
		{append(syncArgs("us", "eu")[:9], clock...), "no --global-store for region \"eu\""},
		{append(syncArgs("us", "eu"), "--global-store", "us="+url["us"]), "this region"},
		{append(syncArgs("us", "eu"), "--global-store", "mars="+url["us"]), "mars"},
		{append(syncArgs("us", "eu"), "--global-window", "0"), "no shares to move"},
		{append(syncArgs("us", "eu"), "--global-store", "eu=http://x"), "named twice"},
	} {
		if out, code := sluice(t, c.args...); code != 2 || !strings.Contains(out, c.want) {
			t.Errorf("%q: exit %d, want 2 naming %q:\n%s", c.args, code, c.want, out)
		}
	}

	replicas := map[string]*server{}
	for _, r := range []string{"us", "eu"} {
		o := testOptions(dir)
		o.backend, o.redis.URL, o.keyPrefix = "redis", url[r], "g"
		o.global = globalOptions{region: r, regions: "us=1,eu=1", window: 2 * time.Second, skew: 100 * time.Millisecond, hold: 200 * time.Millisecond}
		replicas[r], _, _ = startTestServer(t, o)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	logs := map[string]*lockedBuffer{}
	for me, other := range map[string]string{"us": "eu", "eu": "us"} {
		logs[me] = &lockedBuffer{}
		wg.Go(func() {
			if code := run(ctx, append(syncArgs(me, other), "--http-addr", "127.0.0.1:0", "--log-level", "debug"), logs[me], logs[me]); code != 0 {
				t.Errorf("%s's sync: exit %d\n%s", me, code, logs[me])
			}
		})
	}
	defer func() { stop(); wg.Wait() }()
	client := dial(t, replicas["us"].grpcLn.Addr().String())
	ask := func() bool {
		resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
			Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "t1"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode == rlsv3.RateLimitResponse_OK
	}
	// 150 requests a second in us for five windows.
	var admitted, lastWindow int
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for range 3 {
			if ask() {
				admitted++
				if time.Until(deadline) < 2*time.Second {
					lastWindow++
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	// us's base is 50/s: 100 a window. Holding the whole limit, it
	// admits up to 200 in the last one.
	if lastWindow <= 120 {
		t.Errorf("us admitted %d in the last window (%d in all), want more than its base's 100", lastWindow, admitted)
	}
	sharesArgs := append([]string{"shares", "--backend", "redis", "--redis-url", url["eu"], "--key-prefix", "g", "--global-region", "eu",
		"--global-store", "us=" + url["us"], "-o", "json"}, clock...)
	out, code := sluice(t, sharesArgs...)
	var rows []shareRow
	if code != 0 || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 2 {
		t.Fatalf("shares: exit %d\n%s", code, out)
	}
	var entity, resource string
	for _, r := range rows {
		entity, resource = r.Entity, r.Resource
		want := map[string]float64{"us": 100, "eu": 0}[r.Region]
		if r.Base != 50 || r.Share == nil || *r.Share != want || r.Demand == nil {
			t.Errorf("shares: %s\nwant base 50%% and share %v%% in %s", out, want, r.Region)
		}
	}
	if out, code := sluice(t, append(sharesArgs[:len(sharesArgs)-len(clock)-2], append([]string{"--entity", entity, "--resource", resource}, clock...)...)...); code != 0 ||
		!regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(entity)+`\s+`+regexp.QuoteMeta(resource)+`\s+us\s+50\.0%\s+100\.0%`).MatchString(out) {
		t.Errorf("shares as a table: exit %d\n%s", code, out)
	}
	// The replicas report their usage; the syncs' metrics.
	if got, _ := scrape(t, replicas["us"]); got[`sluice_global_usage_reports_total{result=written}`] < 3 {
		t.Errorf("us's replica wrote %v windows of usage, want several", got[`sluice_global_usage_reports_total{result=written}`])
	}
	addr := regexp.MustCompile(`http=(127\.0\.0\.1:\d+)`).FindStringSubmatch(logs["us"].String())
	if addr == nil {
		t.Fatalf("us's sync logged no address:\n%s", logs["us"])
	}
	got, raw := scrapeAddr(t, addr[1])
	for k, min := range map[string]float64{
		`sluice_sync_rounds_total{}`: 8, `sluice_sync_writes_total{}`: 1, `sluice_sync_keys{}`: 1,
		`sluice_global_share{entity=` + entity + `,region=us,resource=` + resource + `}`:  1,
		`sluice_global_demand{entity=` + entity + `,region=us,resource=` + resource + `}`: 1,
	} {
		if got[k] < min {
			t.Errorf("%s = %v, want at least %v\n%s", k, got[k], min, raw)
		}
	}
	documented, served := syncMetrics(t), map[string]bool{}
	for k := range got {
		served[k[:strings.IndexByte(k, '{')]] = true
	}
	for name := range served {
		if strings.HasPrefix(name, "sluice_") && !documented[name] {
			t.Errorf("the sync serves %s, which docs/metrics.md's table of the sync's metrics lacks", name)
		}
	}
	for name := range documented {
		if !served[name] {
			t.Errorf("docs/metrics.md documents %s for the sync, which it does not serve", name)
		}
	}
	if code, body := get(t, "http://"+addr[1]+"/healthz"); code != 200 {
		t.Errorf("/healthz: %d %s", code, body)
	}
}

// syncMetrics lists the metrics of docs/metrics.md's table of the sync's.
func syncMetrics(t *testing.T) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## The sync's metrics\n")
	if !ok {
		t.Fatal("docs/metrics.md has no section of the sync's metrics")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	out := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(sluice_[a-z_]+)`").FindAllStringSubmatch(section, -1) {
		out[m[1]] = true
	}
	if len(out) < 5 {
		t.Fatalf("docs/metrics.md lists %d metrics of the sync", len(out))
	}
	return out
}
