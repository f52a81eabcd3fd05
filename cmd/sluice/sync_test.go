package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rl/sluice/backend/redis/redistest"
)

// TestSyncMovesSharesOnRedis: two regions, each on a Redis database of
// its own, with a replica (serve) and a sync each, 2 s windows. Traffic
// for a global rule in us only: within a few windows `sluice shares`
// shows us holding (nearly) the whole limit, the replica in us
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
	logs := map[string]*syncBuffer{}
	for me, other := range map[string]string{"us": "eu", "eu": "us"} {
		log := &syncBuffer{}
		logs[me] = log
		wg.Go(func() {
			if code := run(ctx, append(syncArgs(me, other), "--http-addr", "127.0.0.1:0", "--log-level", "debug"), log, log); code != 0 {
				t.Errorf("%s's sync: exit %d\n%s", me, code, log)
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
	// 150 requests a second in us for five windows, on a schedule: a
	// caller slowed by a busy machine catches up with the requests it
	// owes (paced by sleeps alone, beside two busy loops it asked 76 a
	// second, and us's demand read under its limit).
	var admitted, lastWindow, sent int
	begin := time.Now()
	deadline := begin.Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for due := int(time.Since(begin).Seconds() * 150); sent < due; sent++ {
			if ask() {
				admitted++
				if time.Until(deadline) < 2*time.Second {
					lastWindow++
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
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
	// eu lends us what it does not use: all of its base, or within the
	// tenth a loan may drift from its right amount before it is changed.
	var entity, resource string
	var sum float64
	for _, r := range rows {
		entity, resource = r.Entity, r.Resource
		if r.Share != nil {
			sum += *r.Share
		}
		if low := r.Region == "eu"; r.Base != 50 || r.Share == nil || r.Demand == nil ||
			(low && *r.Share > 10) || (!low && *r.Share < 90) {
			t.Errorf("shares: %s\nwant base 50%% and most of the limit in us", out)
		}
	}
	if sum > 100 {
		t.Errorf("the shares sum to %v%%, over the limit", sum)
	}
	if out, code := sluice(t, append(sharesArgs[:len(sharesArgs)-len(clock)-2], append([]string{"--entity", entity, "--resource", resource}, clock...)...)...); code != 0 ||
		!regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(entity)+`\s+`+regexp.QuoteMeta(resource)+`\s+us\s+50\.0%\s+(9\d|100)\.\d%`).MatchString(out) {
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
		`sluice_global_share{entity=` + entity + `,region=us,resource=` + resource + `}`:  0.9,
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

// TestSyncKilledKeepsTheBound: two regions on Redis databases of their
// own, a replica and a sync process each, 2 s windows, demand for a
// global limit of 100/s at 120/s in us and 30/s in eu. us's sync is
// killed with SIGKILL in the middle of a window and started again three
// windows later. Over every span of a window, and over the whole run,
// the regions together admit no more than the burst and the rate allow;
// once its sync is back, us holds more than its base again.
func TestSyncKilledKeepsTheBound(t *testing.T) {
	srv := redistest.Require(t)
	dir := t.TempDir()
	rules := "domain: api\ndescriptors:\n  - key: tenant\n    global: true\n    limits: [{name: rps, rate: 100/s}]\n"
	if err := os.WriteFile(filepath.Join(dir, "api.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	url := map[string]string{"us": "redis://" + srv.Addr() + "/2", "eu": "redis://" + srv.Addr() + "/3"}
	const window = 2 * time.Second
	replicas := map[string]*server{}
	for _, r := range []string{"us", "eu"} {
		o := testOptions(dir)
		o.backend, o.redis.URL, o.keyPrefix = "redis", url[r], "k"
		o.global = globalOptions{region: r, regions: "us=1,eu=1", window: window, skew: 100 * time.Millisecond, hold: 200 * time.Millisecond}
		replicas[r], _, _ = startTestServer(t, o)
	}
	startSync := func(me, other string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "sync", "--backend", "redis", "--redis-url", url[me], "--key-prefix", "k", "--global-region", me,
			"--global-regions", "us=1,eu=1", "--global-store", other+"="+url[other], "--global-window", "2s", "--global-skew", "100ms",
			"--global-hold", "200ms", "--http-addr", "127.0.0.1:0")
		cmd.Env = append(os.Environ(), runMainEnv+"=1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	usSync := startSync("us", "eu")
	startSync("eu", "us")

	const tick = 100 * time.Millisecond
	const ticks = 13 * int(window/tick)
	admitted := map[string][]atomic.Int64{"us": make([]atomic.Int64, ticks), "eu": make([]atomic.Int64, ticks)}
	start := time.Now()
	ctx, stop := context.WithTimeout(context.Background(), time.Duration(ticks)*tick)
	defer stop()
	var wg sync.WaitGroup
	for region, rate := range map[string]int{"us": 120, "eu": 30} {
		client := dial(t, replicas[region].grpcLn.Addr().String())
		for range 4 {
			wg.Go(func() {
				every := time.Duration(4 * int(time.Second) / rate)
				for next := time.Now(); ctx.Err() == nil; next = next.Add(every) {
					time.Sleep(time.Until(next))
					began := time.Now()
					resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api",
						Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "t1"}}}}})
					if n := int(began.Sub(start) / tick); err == nil && resp.OverallCode == rlsv3.RateLimitResponse_OK && n < ticks {
						admitted[region][n].Add(1)
					}
				}
			})
		}
	}
	// Kill us's sync in the middle of the fifth window; start it again
	// three windows later.
	time.Sleep(time.Until(start.Add(4*window + window/2)))
	usSync.Process.Signal(syscall.SIGKILL)
	usSync.Wait()
	time.Sleep(time.Until(start.Add(7*window + window/2)))
	startSync("us", "eu")
	wg.Wait()

	sum := func(region string, from, to int) (n int64) {
		for i := max(from, 0); i < min(to, ticks); i++ {
			if region != "eu" {
				n += admitted["us"][i].Load()
			}
			if region != "us" {
				n += admitted["eu"][i].Load()
			}
		}
		return n
	}
	win := int(window / tick)
	for from := 0; from+win <= ticks; from++ {
		// 100 of burst, 200 of rate, and a call a region on its way.
		if got := sum("", from, from+win); got > 100+200+2 {
			t.Errorf("ticks %d to %d: %d admitted, over the 302 the limit allows", from, from+win, got)
		}
	}
	if got, allowed := sum("", 0, ticks), 100+100*(time.Duration(ticks)*tick+time.Second).Seconds()+2; float64(got) > allowed {
		t.Errorf("the run: %d admitted, over B + R*T + 2 = %.0f", got, allowed)
	}
	// us's base is 50/s, 200 in two windows; back with its sync, it holds
	// its part of the demand again, 80/s.
	if got := sum("us", ticks-2*win, ticks); got <= 250 {
		t.Errorf("us admitted %d in the last two windows, want more than its base's 200 (its part of demand is 320)", got)
	}
}
