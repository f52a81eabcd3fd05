package main

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluice-rl/sluice/backend/redis/redistest"
	"github.com/sluice-rl/sluice/certs/certstest"
	"github.com/sluice-rl/sluice/descriptors/xds/xdstest"
)

// egDefaultEnv is the environment of Envoy Gateway's default rate-limit
// Deployment, in order, as its internal/infrastructure/kubernetes/
// ratelimit/resource.go (expectedRateLimitContainerEnv, at 0f0e417) writes
// it with its defaults: Prometheus on, and the Redis URL it requires.
// (Its testdata deployments/default.yaml of earlier releases ran a
// statsd_exporter sidecar, with USE_STATSD, instead of USE_PROMETHEUS.)
var egDefaultEnv = [][2]string{
	{"RUNTIME_ROOT", "/data"},
	{"RUNTIME_SUBDIRECTORY", "ratelimit"},
	{"RUNTIME_IGNOREDOTFILES", "true"},
	{"RUNTIME_WATCH_ROOT", "false"},
	{"LOG_LEVEL", "info"},
	{"USE_STATSD", "false"},
	{"CONFIG_TYPE", "GRPC_XDS_SOTW"},
	{"CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"},
	{"CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"},
	{"GRPC_SERVER_USE_TLS", "true"},
	{"GRPC_SERVER_TLS_CERT", "/certs/tls.crt"},
	{"GRPC_SERVER_TLS_KEY", "/certs/tls.key"},
	{"GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"},
	{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"},
	{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"},
	{"FORCE_START_WITHOUT_INITIAL_CONFIG", "true"},
	{"REDIS_SOCKET_TYPE", "tcp"},
	{"REDIS_URL", "redis.redis.svc:6379"},
	{"USE_PROMETHEUS", "true"},
	{"PROMETHEUS_ADDR", ":19001"},
	{"PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"},
}

// egTestdataEnv is the environment of the same Deployment as its testdata
// deployments/default.yaml stores it (at f814ea13), in order: a
// statsd_exporter sidecar served the metrics then, and statsd was off.
var egTestdataEnv = [][2]string{
	{"REDIS_SOCKET_TYPE", "tcp"},
	{"REDIS_URL", "redis.redis.svc:6379"},
	{"RUNTIME_ROOT", "/data"},
	{"RUNTIME_SUBDIRECTORY", "ratelimit"},
	{"RUNTIME_IGNOREDOTFILES", "true"},
	{"RUNTIME_WATCH_ROOT", "false"},
	{"LOG_LEVEL", "info"},
	{"USE_STATSD", "false"},
	{"CONFIG_TYPE", "GRPC_XDS_SOTW"},
	{"CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"},
	{"CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"},
	{"GRPC_SERVER_USE_TLS", "true"},
	{"GRPC_SERVER_TLS_CERT", "/certs/tls.crt"},
	{"GRPC_SERVER_TLS_KEY", "/certs/tls.key"},
	{"GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"},
	{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"},
	{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"},
	{"FORCE_START_WITHOUT_INITIAL_CONFIG", "true"},
}

func lookupIn(env [][2]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		for _, kv := range env {
			if kv[0] == name {
				return kv[1], true
			}
		}
		return "", false
	}
}

// Envoy Gateway's environment becomes serve's flags: its ports, log level,
// xDS server and node over mutual TLS, a start without rules, and gRPC
// over mutual TLS; what Sluice cannot honour is named, with why.
func TestRatelimitEnvOfEnvoyGateway(t *testing.T) {
	args, ignored, err := ratelimitArgs(lookupIn(egDefaultEnv))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"--grpc-addr", "0.0.0.0:8081", "--http-addr", "0.0.0.0:8080", "--debug-addr", "0.0.0.0:6070",
		"--log-level", "info",
		"--xds-server", "envoy-gateway:18001", "--xds-node-id", "envoy-ratelimit",
		"--xds-tls-ca", "/certs/ca.crt", "--xds-tls-cert", "/certs/tls.crt", "--xds-tls-key", "/certs/tls.key",
		"--xds-start-without-rules",
		"--tls-cert", "/certs/tls.crt", "--tls-key", "/certs/tls.key", "--tls-client-ca", "/certs/ca.crt",
		"--metrics-addr", ":19001", "--ratelimit-metrics",
		"--backend", "redis", "--redis-url", "redis://redis.redis.svc:6379"}
	if !reflect.DeepEqual(args, want) {
		t.Errorf("flags\n got %q\nwant %q", args, want)
	}
	var names []string
	for _, n := range ignored {
		name, _, _ := strings.Cut(n, ":")
		names = append(names, name)
	}
	// What envoyproxy/ratelimit would also ignore here (RUNTIME_* with
	// xDS, USE_STATSD=false) is not named.
	wantIgnored := []string{"PROMETHEUS_MAPPER_YAML"}
	if !reflect.DeepEqual(names, wantIgnored) {
		t.Errorf("ignored %q, want %q", names, wantIgnored)
	}
	// Earlier releases' statsd: named, since no statsd is sent.
	_, ignored, err = ratelimitArgs(lookupIn([][2]string{{"USE_STATSD", "true"}, {"STATSD_PORT", "9125"}}))
	if err != nil || len(ignored) != 1 || !strings.HasPrefix(ignored[0], "USE_STATSD: ") {
		t.Errorf("USE_STATSD=true: ignored %q, %v", ignored, err)
	}
	// The file-based default of envoyproxy/ratelimit, and bad values.
	args, _, err = ratelimitArgs(lookupIn([][2]string{{"RUNTIME_ROOT", "/srv"}, {"RUNTIME_SUBDIRECTORY", "rl"}, {"LOG_LEVEL", "WARNING"}}))
	if err != nil || !strings.Contains(strings.Join(args, " "), "--log-level warn --config-dir /srv/rl/config") {
		t.Errorf("file config: %q %v", args, err)
	}
	for _, bad := range [][2]string{{"CONFIG_TYPE", "CONSUL"}, {"GRPC_SERVER_USE_TLS", "yes please"}, {"USE_PROMETHEUS", "on"}} {
		if _, _, err := ratelimitArgs(lookupIn([][2]string{bad})); err == nil || !strings.Contains(err.Error(), bad[0]) {
			t.Errorf("%s=%s: %v, want an error naming it", bad[0], bad[1], err)
		}
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// The binary started as /bin/ratelimit with Envoy Gateway's environment
// (paths and addresses moved to the test's own), as the pod runs it
// (user 65534, a file system it cannot write), keeps its buckets in the
// Redis of REDIS_URL, answers /healthcheck
// before any rules have come, takes them from the xDS server over mutual
// TLS, serves gRPC over mutual TLS with them, and the counters Envoy
// Gateway's dashboards read on PROMETHEUS_ADDR (when it is set: its
// earlier pods ran a statsd_exporter sidecar instead).
func TestRunsAsRatelimitInEnvoyGatewaysPod(t *testing.T) {
	t.Run("resource.go", func(t *testing.T) { runEnvoyGatewaysPod(t, egDefaultEnv) })
	t.Run("testdata", func(t *testing.T) { runEnvoyGatewaysPod(t, egTestdataEnv) })
}

func runEnvoyGatewaysPod(t *testing.T, podEnv [][2]string) {
	x := xdstest.Start(t)
	pod := newPodSandbox(t)
	ca := certstest.NewCA(t, "eg-ca")
	caFile := pod.file(t, "ca.crt", ca.PEM)
	srv := ca.Issue(t, "localhost", true)
	srvCert, srvKey := pod.file(t, "tls.crt", srv.CertPEM), pod.file(t, "tls.key", srv.KeyPEM)
	xdsCA, xdsCert, xdsKey := pod.copy(t, x.CAFile), pod.copy(t, x.CertFile), pod.copy(t, x.KeyFile)
	grpcPort, httpPort, promPort := freePort(t), freePort(t), freePort(t)
	redisSrv := redistest.Require(t)
	moved := map[string]string{
		"REDIS_URL":                         redisSrv.Addr(),
		"PROMETHEUS_ADDR":                   "127.0.0.1:" + promPort,
		"CONFIG_GRPC_XDS_SERVER_URL":        x.Addr,
		"CONFIG_GRPC_XDS_NODE_ID":           xdstest.NodeID,
		"GRPC_SERVER_TLS_CERT":              srvCert,
		"GRPC_SERVER_TLS_KEY":               srvKey,
		"GRPC_SERVER_TLS_CA_CERT":           caFile,
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT":   xdsCert,
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY":    xdsKey,
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": xdsCA,
		"RUNTIME_ROOT":                      pod.dir,
	}
	env := append(os.Environ(), "HOME=/nonexistent", runMainEnv+"=1", "GRPC_HOST=127.0.0.1", "GRPC_PORT="+grpcPort,
		"HOST=127.0.0.1", "PORT="+httpPort, "DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+freePort(t))
	prometheus := false
	for _, kv := range podEnv {
		prometheus = prometheus || kv[0] == "USE_PROMETHEUS"
		v := kv[1]
		if m, ok := moved[kv[0]]; ok {
			v = m
		}
		env = append(env, kv[0]+"="+v)
	}
	out := &syncBuffer{}
	cmd := pod.command(pod.bin)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	waitUntil(t, 20*time.Second, "/healthcheck answering 200 before any rules", func() bool {
		resp, err := httpGet("http://127.0.0.1:" + httpPort + "/healthcheck")
		return err == nil && resp == 200
	})
	_, ignored, err := ratelimitArgs(lookupIn(podEnv))
	if err != nil {
		t.Fatal(err)
	}
	for _, note := range ignored {
		name, _, _ := strings.Cut(note, ":")
		if !strings.Contains(out.String(), `"envoyproxy/ratelimit setting ignored" setting=`+name+" ") {
			t.Errorf("%s is ignored but not named:\n%s", name, out.String())
		}
	}
	x.Set(t, "v1", perMinute("gw", 1))

	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	creds := credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "localhost",
		Certificates: []tls.Certificate{ca.Issue(t, "envoy", false).TLSCert(t)}})
	conn, err := grpc.NewClient("127.0.0.1:"+grpcPort, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	waitUntil(t, 10*time.Second, "the xDS rules in force", func() bool {
		resp, err := ask(c, "gw", "client", "probe")
		return err == nil && resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() == 1
	})
	// Envoy Gateway's dashboards read the rule's counters on
	// PROMETHEUS_ADDR; the probes above count under the same key.
	var before map[string]float64
	if prometheus {
		before, _ = scrapeAddr(t, "127.0.0.1:"+promPort)
	}
	resp, err := ask(c, "gw", "client", "c1")
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first call: %v %v\n%s", resp, err, out.String())
	}
	if resp, err = ask(c, "gw", "client", "c1"); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second call under 1/minute: %v %v", resp, err)
	}
	// The buckets are in the Redis REDIS_URL names.
	if keys, err := redisSrv.Do(t.Context(), "DBSIZE"); err != nil || keys == "0" {
		t.Errorf("Redis holds %s keys (%v) after the decisions", keys, err)
	}
	pod.checkUser(t, cmd.Process.Pid)
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		pod.checkNothingWritten(t)
	}()
	if !prometheus {
		return
	}
	after, raw := scrapeAddr(t, "127.0.0.1:"+promPort)
	for stat, want := range map[string]float64{"total_hits": 2, "within_limit": 1, "over_limit": 1} {
		name := "ratelimit_service_rate_limit_" + stat + "{domain=gw,key1=client,key2=}"
		if d := after[name] - before[name]; d != want {
			t.Errorf("%s grew by %v, want %v; PROMETHEUS_ADDR serves:\n%s", name, d, want, raw)
		}
	}
}

func httpGet(url string) (int, error) {
	resp, err := (&http.Client{Timeout: time.Second}).Get(url)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// docs/envoy-gateway.md names every variable Sluice reads or ignores as
// envoyproxy/ratelimit, and each one it names is read (setting it changes
// serve's flags) or ignored with a reason.
func TestEnvoyGatewayDocNamesEveryVariable(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "envoy-gateway.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cell := strings.SplitN(line, "|", 3)[1]
		for _, m := range regexp.MustCompile("`([A-Z_]+)`").FindAllStringSubmatch(cell, -1) {
			documented[m[1]] = true
		}
	}
	ignored := ratelimitIgnored()
	for name := range ignored {
		if !documented[name] {
			t.Errorf("%s is ignored but not in docs/envoy-gateway.md", name)
		}
	}
	base, _, _ := ratelimitArgs(lookupIn(nil))
	for name := range documented {
		if _, ok := ignored[name]; ok {
			continue
		}
		read := false
		// The others a variable may need to matter: xDS, TLS,
		// Prometheus and Redis (over TLS) on.
		var others [][2]string
		if name != "CONFIG_TYPE" && name != "RUNTIME_ROOT" && name != "RUNTIME_SUBDIRECTORY" {
			for _, kv := range [][2]string{{"CONFIG_TYPE", "GRPC_XDS_SOTW"}, {"CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"}, {"GRPC_SERVER_USE_TLS", "true"}, {"USE_PROMETHEUS", "true"},
				{"REDIS_URL", "redis.example:6379"}, {"REDIS_SOCKET_TYPE", "tcp"}, {"REDIS_TLS", "true"}} {
				if kv[0] != name {
					others = append(others, kv)
				}
			}
		}
		for _, v := range []string{"true", "9999", "x.example:1", "GRPC_XDS_SOTW", "json", "tcp", "CLUSTER"} {
			without, _, _ := ratelimitArgs(lookupIn(others))
			with, _, err := ratelimitArgs(lookupIn(append([][2]string{{name, v}}, others...)))
			if err == nil && !reflect.DeepEqual(with, without) && !reflect.DeepEqual(with, base) {
				read = true
				break
			}
		}
		if !read {
			t.Errorf("docs/envoy-gateway.md names %s, which Sluice neither reads nor ignores", name)
		}
	}
	if len(documented) < 30 {
		t.Errorf("found %d variables in docs/envoy-gateway.md", len(documented))
	}
}

// envoyproxy/ratelimit's Redis settings select the redis backend, as its
// documentation describes them: REDIS_URL as host:port or a socket path
// (REDIS_SOCKET_TYPE, unix by default), lists of nodes for a Cluster and
// of Sentinels after the primary's name, REDIS_AUTH as a password or
// user:password, REDIS_AUTH_FILE, REDIS_TLS with its files. SLUICE_BACKEND
// still chooses when set.
func TestRatelimitRedisEnv(t *testing.T) {
	for _, c := range []struct {
		name string
		env  [][2]string
		want []string // after --backend redis --redis-url; nil: no redis flags
		err  string
	}{
		{"envoy gateway", [][2]string{{"REDIS_SOCKET_TYPE", "tcp"}, {"REDIS_URL", "redis.svc:6379"}}, []string{"redis://redis.svc:6379"}, ""},
		{"socket by default", [][2]string{{"REDIS_URL", "/var/run/redis.sock"}}, []string{"unix:///var/run/redis.sock"}, ""},
		{"a URL as it is", [][2]string{{"REDIS_SOCKET_TYPE", "tcp"}, {"REDIS_URL", "redis://u:p@h:1/2"}, {"REDIS_TLS", "true"}}, []string{"rediss://u:p@h:1/2"}, ""},
		{"password", [][2]string{{"REDIS_SOCKET_TYPE", "tcp"}, {"REDIS_URL", "h:6379"}, {"REDIS_AUTH", "s3cret"}},
			[]string{"redis://h:6379", "--redis-password", "s3cret"}, ""},
		{"user and password", [][2]string{{"REDIS_SOCKET_TYPE", "tcp"}, {"REDIS_URL", "h:6379"}, {"REDIS_AUTH", "app:pa:ss"}},
			[]string{"redis://app@h:6379", "--redis-password", "pa:ss"}, ""},
		{"password file", [][2]string{{"REDIS_SOCKET_TYPE", "tcp"}, {"REDIS_URL", "h:6379"}, {"REDIS_AUTH_FILE", "/secrets/redis"}},
			[]string{"redis://h:6379", "--redis-password-file", "/secrets/redis"}, ""},
		{"tls", [][2]string{{"REDIS_SOCKET_TYPE", "tcp"}, {"REDIS_URL", "h:6380"}, {"REDIS_TLS", "true"},
			{"REDIS_TLS_CACERT", "/c/ca.crt"}, {"REDIS_TLS_CLIENT_CERT", "/redis-certs/tls.crt"}, {"REDIS_TLS_CLIENT_KEY", "/redis-certs/tls.key"},
			{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"}},
			[]string{"rediss://h:6380", "--redis-tls-ca", "/c/ca.crt", "--redis-tls-cert", "/redis-certs/tls.crt",
				"--redis-tls-key", "/redis-certs/tls.key", "--redis-tls-skip-hostname-verification"}, ""},
		{"cluster", [][2]string{{"REDIS_TYPE", "cluster"}, {"REDIS_URL", "n1:7000, n2:7001,n3:7002"}},
			[]string{"redis://n1:7000?addr=n2%3A7001&addr=n3%3A7002"}, ""},
		{"sentinel", [][2]string{{"REDIS_TYPE", "SENTINEL"}, {"REDIS_URL", "mymaster,s1:26379,s2:26379"}, {"REDIS_TLS", "true"}},
			[]string{"rediss://s1:26379?addr=s2%3A26379&master_set=mymaster"}, ""},
		{"sentinel without sentinels", [][2]string{{"REDIS_TYPE", "SENTINEL"}, {"REDIS_URL", "mymaster"}}, nil, "REDIS_TYPE=SENTINEL"},
		{"unknown type", [][2]string{{"REDIS_TYPE", "RING"}, {"REDIS_URL", "h:1"}}, nil, `REDIS_TYPE="RING"`},
		{"unknown socket", [][2]string{{"REDIS_SOCKET_TYPE", "udp"}, {"REDIS_URL", "h:1"}}, nil, `REDIS_SOCKET_TYPE="udp"`},
		{"two passwords", [][2]string{{"REDIS_URL", "h:1"}, {"REDIS_AUTH", "a"}, {"REDIS_AUTH_FILE", "/f"}}, nil, "REDIS_AUTH and REDIS_AUTH_FILE"},
		{"no URL", [][2]string{{"REDIS_SOCKET_TYPE", "tcp"}}, nil, ""},
		{"memcache", [][2]string{{"BACKEND_TYPE", "memcache"}, {"REDIS_URL", "h:1"}}, nil, ""},
		{"SLUICE_BACKEND chooses", [][2]string{{"SLUICE_BACKEND", "dynamodb"}, {"REDIS_URL", "h:1"}}, nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			args, ignored, err := ratelimitArgs(lookupIn(c.env))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one naming %s", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			at := slices.Index(args, "--backend")
			switch {
			case c.want == nil && at >= 0:
				t.Fatalf("flags %q select a backend", args)
			case c.want == nil:
			case at < 0 || args[at+1] != "redis" || args[at+2] != "--redis-url" || !reflect.DeepEqual(args[at+3:], c.want):
				t.Fatalf("flags %q, want --backend redis --redis-url %q", args, c.want)
			}
			if c.name == "SLUICE_BACKEND chooses" && (len(ignored) != 1 || !strings.HasPrefix(ignored[0], "REDIS_URL: SLUICE_BACKEND=dynamodb")) {
				t.Errorf("ignored %q: REDIS_URL is not named", ignored)
			}
		})
	}
}
