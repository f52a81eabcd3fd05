package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/backend/redis/redistest"
)

// serve on the Redis backend: a missing URL, an unreachable server or a
// wrong password stop it at once, saying so (and never the password);
// two replicas on one Redis share every bucket; /metrics shows one
// script per decision and the config reads.
func TestServeOnRedis(t *testing.T) {
	srv := redistest.RequireWith(t, redistest.Options{Password: "pw-s3cret"})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(rulesV1), 0o644); err != nil {
		t.Fatal(err)
	}
	local := []string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", "", "--config-dir", dir, "--backend", "redis"}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "--redis-url"},
		{[]string{"--redis-url", "redis://127.0.0.1:1"}, 1, "127.0.0.1:1"},
		{[]string{"--redis-url", "redis://:wrong-pw@" + srv.Addr()}, 1, "WRONGPASS"},
		{[]string{"--redis-url", "redis://" + srv.Addr(), "--overrides", "x.yaml"}, 2, "--overrides"},
		{[]string{"--redis-url", "http://" + srv.Addr()}, 1, "scheme"},
	} {
		out, code := sluice(t, append(local, c.args...)...)
		if code != c.code || !strings.Contains(out, c.want) || strings.Contains(out, "wrong-pw") {
			t.Errorf("serve %q: exit %d, want %d naming %q (without the password):\n%s", c.args, code, c.code, c.want, out)
		}
	}

	t.Setenv("SLUICE_REDIS_PASSWORD", "pw-s3cret")
	var replicas []*server
	for range 2 {
		o := testOptions(dir)
		o.backend, o.redis.URL, o.redis.Password, o.keyPrefix = "redis", srv.URL(), "pw-s3cret", "e2e"
		s, _, _ := startTestServer(t, o)
		if code, body := get(t, "http://"+s.httpLn.Addr().String()+"/readyz"); code != 200 {
			t.Fatalf("/readyz %d %s", code, body)
		}
		replicas = append(replicas, s)
	}
	// 2 a minute for 10.1.1.1, shared: one call on each replica, then
	// both deny.
	for i, want := range []string{"OK", "OK", "OVER_LIMIT", "OVER_LIMIT"} {
		args := []string{"check", "--grpc-addr", replicas[i%2].grpcLn.Addr().String(), "--domain", "edge", "--descriptor", "remote_address=10.1.1.1"}
		if out, code := sluice(t, args...); code != 0 || !strings.HasPrefix(out, want) {
			t.Fatalf("check %d on replica %d: exit %d, want %s\n%s", i, i%2, code, want, out)
		}
	}
	if n, err := srv.Do(t.Context(), "EXISTS", "e2e:b:{10.1.1.1}:10.1.1.1:edge/remote_address"); err != nil || n != "1" {
		keys, _ := srv.Do(t.Context(), "KEYS", "*")
		t.Fatalf("the bucket is not under the key prefix: EXISTS %s %v (keys: %s)", n, err, keys)
	}
	got, raw := scrape(t, replicas[0])
	for k, ok := range map[string]bool{
		`sluice_backend_call_duration_seconds_count{backend=redis,operation=decide}`:  got[`sluice_backend_call_duration_seconds_count{backend=redis,operation=decide}`] == 2,
		`sluice_backend_call_duration_seconds_count{backend=redis,operation=EVALSHA}`: got[`sluice_backend_call_duration_seconds_count{backend=redis,operation=EVALSHA}`] == 2,
		`sluice_backend_call_duration_seconds_count{backend=redis,operation=HGETALL}`: got[`sluice_backend_call_duration_seconds_count{backend=redis,operation=HGETALL}`] == 1,
		`sluice_bucket_writes_total{ttl=set}`:                                         got[`sluice_bucket_writes_total{ttl=set}`] == 1,
		`sluice_config_cache_misses_total{}`:                                          got[`sluice_config_cache_misses_total{}`] == 1,
		`sluice_config_cache_hits_total{}`:                                            got[`sluice_config_cache_hits_total{}`] == 1,
		`sluice_config_cache_size{}`:                                                  got[`sluice_config_cache_size{}`] == 1,
	} {
		if !ok {
			t.Errorf("%s = %v\n%s", k, got[k], raw)
		}
	}
	checkMetricsDocumented(t, got, "redis")
	if v := replicas[0].describe().Redis; v == nil || v.Scripts == 0 || v.Leases == nil || v.Leases.Horizon != "30s" {
		t.Errorf("/debug/config shows no Redis runs or leases: %+v", v)
	}
}
