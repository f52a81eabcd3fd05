package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/dynamodb/dynamodbtest"
)

// Secrets the tests hand to Sluice and then look for where they must not
// be. Every one contains its marker, so a search for the marker also
// finds one cut short or quoted.
const (
	// apiKeyMarker is in the descriptor values of requests: API keys, the
	// typical entity of a rate limit, are credentials of the callers.
	apiKeyMarker = "qv5apikey"
	// credMarker is in the AWS credentials of the environment.
	credMarker = "kx9awscred"
)

// setAWSSecrets puts distinctive AWS credentials in the environment (on
// top of awsEnv's isolation); DynamoDB Local takes any.
func setAWSSecrets(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIA"+strings.ToUpper(credMarker)+"01")
	t.Setenv("AWS_SECRET_ACCESS_KEY", credMarker+"/secret+access+key/0123456789abcdef")
	t.Setenv("AWS_SESSION_TOKEN", credMarker+"-session-token-0123456789abcdef")
}

// noSecret fails the test when text holds a marker, showing where.
func noSecret(t *testing.T, what, text string, markers ...string) {
	t.Helper()
	lower := strings.ToLower(text)
	for _, m := range markers {
		if i := strings.Index(lower, strings.ToLower(m)); i >= 0 {
			t.Errorf("%s holds a secret (%s): ...%s...", what, m, text[max(0, i-200):min(len(text), i+100)])
		}
	}
}

// unsetEnv removes variables for the test, restoring them after.
func unsetEnv(t *testing.T, keys ...string) {
	for _, k := range keys {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
}

// serveCommandLine runs `sluice serve args...` through the command line
// (flags, environment, validation), in this process, until the test ends,
// and returns its listeners' addresses as it logged them, in text or JSON.
// Unlike startTestServer it takes every flag not given from its default.
// At the test's end the server must stop within 30 s, exiting 0.
func serveCommandLine(t *testing.T, args ...string) map[string]string {
	t.Helper()
	unsetEnv(t, "SLUICE_GRPC_ADDR", "SLUICE_HTTP_ADDR", "SLUICE_DEBUG_ADDR", "SLUICE_PPROF")
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	exit := make(chan int, 1)
	go func() { exit <- run(ctx, append([]string{"serve"}, args...), &out, &out) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-exit:
			if code != 0 {
				t.Errorf("sluice serve exited %d:\n%s", code, out.String())
			}
		case <-time.After(30 * time.Second):
			t.Errorf("sluice serve still running 30 s after the test ended:\n%s", out.String())
		}
	})
	var addrs map[string]string
	waitUntil(t, 30*time.Second, "sluice serve starting", func() bool {
		select {
		case code := <-exit:
			exit <- code
			t.Fatalf("sluice serve exited %d:\n%s", code, out.String())
		default:
		}
		addrs = servingAddrs(out.String())
		return addrs != nil
	})
	return addrs
}

// canConnect reports whether a TCP connection to addr is accepted.
func canConnect(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// ask sends one request of single-entry descriptors (key, value, key,
// value...).
func ask(c rlsv3.RateLimitServiceClient, domain string, kv ...string) (*rlsv3.RateLimitResponse, error) {
	req := &rlsv3.RateLimitRequest{Domain: domain}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Descriptors = append(req.Descriptors, &rlv3.RateLimitDescriptor{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: kv[i], Value: kv[i+1]}}})
	}
	return send(c, req)
}

func send(c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.ShouldRateLimit(ctx, req)
}

// rulesSecurity limits by API key, and by plan with detailed metrics
// (whose entity label is the documented opt-in exception).
const rulesSecurity = `domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: plan
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// With serve's defaults, the debug listener (/debug/config, and pprof when
// asked for) takes connections on loopback only, pprof is off, and the
// public HTTP listener serves health, readiness and metrics and nothing
// of the debug side. Ports are the one thing not defaulted: each listener
// keeps its default host with port 0, so the test never fights another
// process for 8080 or 6070.
func TestServeDefaultsKeepDebugEndpointsLocal(t *testing.T) {
	flags := newServeCommand().Flags()
	anyPort := func(flag string) string {
		host, _, err := net.SplitHostPort(flags.Lookup(flag).DefValue)
		if err != nil {
			t.Fatalf("--%s default %q: %v", flag, flags.Lookup(flag).DefValue, err)
		}
		return net.JoinHostPort(host, "0")
	}
	if d := flags.Lookup("pprof").DefValue; d != "false" {
		t.Errorf("--pprof defaults to %s", d)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "api.yaml"), []byte(rulesSecurity), 0o644); err != nil {
		t.Fatal(err)
	}
	addrs := serveCommandLine(t, "--config-dir", dir, "--grpc-addr", "127.0.0.1:0",
		"--http-addr", anyPort("http-addr"), "--debug-addr", anyPort("debug-addr"))

	host, _, err := net.SplitHostPort(addrs["debug"])
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		t.Fatalf("debug listener on %q, want a loopback address", addrs["debug"])
	}
	// 127.0.0.2 is this machine too, but not the address the debug
	// listener is bound to: it must refuse there, while the HTTP listener
	// (all interfaces by default) accepts there, which shows the probe
	// itself works.
	if canConnect("127.0.0.2:" + port(t, addrs["http"])) {
		if canConnect("127.0.0.2:" + port(t, addrs["debug"])) {
			t.Errorf("the debug listener %s accepts connections on 127.0.0.2", addrs["debug"])
		}
	} else {
		t.Logf("127.0.0.2 does not reach the HTTP listener %s here; the bound address alone is checked", addrs["http"])
	}

	debugURL, httpURL := "http://"+addrs["debug"], "http://"+addrs["http"]
	for _, c := range []struct {
		url  string
		want int
	}{
		{debugURL + "/debug/config", 200},
		{debugURL + "/debug/pprof/", 404},
		{debugURL + "/debug/pprof/cmdline", 404},
		{debugURL + "/debug/pprof/heap", 404},
		{debugURL + "/debug/vars", 404}, // expvar is linked in, and must not be served
		{httpURL + "/healthz", 200},
		{httpURL + "/readyz", 200},
		{httpURL + "/metrics", 200},
		{httpURL + "/debug/config", 404},
		{httpURL + "/debug/pprof/", 404},
		{httpURL + "/debug/vars", 404},
	} {
		if code, body := get(t, c.url); code != c.want {
			t.Errorf("GET %s: %d, want %d\n%.300s", c.url, code, c.want, body)
		}
	}

	// The gRPC port serves the rate-limit service, the quota service,
	// health and reflection, and no admin service (channelz, CSDS...)
	// besides.
	conn := dialConn(t, addrs["grpc"])
	services := strings.Fields(listServices(t, conn))
	slices.Sort(services)
	want := []string{"envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
		"envoy.service.ratelimit.v3.RateLimitService", "grpc.health.v1.Health",
		"grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"}
	if !slices.Equal(services, want) {
		t.Errorf("gRPC services %v, want %v", services, want)
	}

	// Request values stay out of /metrics and /debug/config: API keys as
	// descriptor values and as a domain no rule defines.
	c := rlsv3.NewRateLimitServiceClient(conn)
	for _, r := range [][]string{
		{"api", "api_key", "sk-" + apiKeyMarker + "-1"},
		{"api", "unknown_key", "sk-" + apiKeyMarker + "-2"},
		{"api-" + apiKeyMarker, "api_key", "sk-" + apiKeyMarker + "-3"},
		{"api", "plan", "gold"},
	} {
		if _, err := ask(c, r[0], r[1:]...); err != nil {
			t.Fatalf("request %v: %v", r, err)
		}
	}
	_, metrics := get(t, httpURL+"/metrics")
	noSecret(t, "/metrics", metrics, apiKeyMarker)
	_, config := get(t, debugURL+"/debug/config")
	noSecret(t, "/debug/config", config, apiKeyMarker)
	// The exception, opted into per rule and documented: detailed_metric
	// makes the entity a label.
	if !strings.Contains(metrics, `entity="gold"`) {
		t.Errorf("detailed_metric rule: no entity label on /metrics")
	}
}

// --pprof serves the profiles on the debug listener, and only there.
func TestPprofOnlyOnTheDebugListener(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "api.yaml"), []byte(rulesSecurity), 0o644); err != nil {
		t.Fatal(err)
	}
	addrs := serveCommandLine(t, "--config-dir", dir, "--grpc-addr", "127.0.0.1:0",
		"--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0", "--pprof")
	for _, c := range []struct {
		url  string
		want int
	}{
		{"http://" + addrs["debug"] + "/debug/pprof/", 200},
		{"http://" + addrs["debug"] + "/debug/pprof/cmdline", 200},
		{"http://" + addrs["debug"] + "/debug/pprof/heap?debug=1", 200},
		{"http://" + addrs["http"] + "/debug/pprof/", 404},
		{"http://" + addrs["http"] + "/debug/pprof/heap", 404},
	} {
		if code, body := get(t, c.url); code != c.want {
			t.Errorf("GET %s: %d, want %d\n%.300s", c.url, code, c.want, body)
		}
	}
}

// quotingError is a backend failure as the AWS SDK and the DynamoDB
// backend report one: typed fields (code, operation, HTTP status, request
// ID), and a message that quotes the request's entity.
type quotingError struct{ entity string }

func (e quotingError) Error() string {
	return fmt.Sprintf("bucket %q/\"api/api_key\": operation error DynamoDB: UpdateItem, https response error StatusCode: 400, "+
		"RequestID: REQ-7, ThrottlingException: rate exceeded for key ENTITY#%s", e.entity, e.entity)
}
func (quotingError) ErrorCode() string        { return "ThrottlingException" }
func (quotingError) Service() string          { return "DynamoDB" }
func (quotingError) Operation() string        { return "UpdateItem" }
func (quotingError) HTTPStatusCode() int      { return 400 }
func (quotingError) ServiceRequestID() string { return "REQ-7" }

// hostileBackend fails the decisions of entities starting with "fail-",
// with an error quoting the entity, and panics on those starting with
// "panic-", with a message quoting it.
type hostileBackend struct{ backend.Backend }

func (b hostileBackend) Decide(ctx context.Context, req *backend.Request) (backend.Decision, error) {
	switch {
	case strings.HasPrefix(req.Entity, "fail-"):
		return backend.Decision{}, fmt.Errorf("waiting for bucket %q: %w", req.Entity, quotingError{req.Entity})
	case strings.HasPrefix(req.Entity, "panic-"):
		panic(fmt.Sprintf("bucket %q is corrupt", req.Entity))
	}
	return b.Backend.Decide(ctx, req)
}

// hostileRequests are invalid requests that carry API keys.
func hostileRequests() []*rlsv3.RateLimitRequest {
	one := func(key, value string) []*rlv3.RateLimitDescriptor {
		return []*rlv3.RateLimitDescriptor{entries(key, value)}
	}
	return []*rlsv3.RateLimitRequest{
		{Domain: "api", Descriptors: one("api_key", strings.Repeat("k", 5000)+apiKeyMarker)},
		{Domain: "api", Descriptors: one("", "sk-"+apiKeyMarker+"-empty-key")},
		{Domain: "api", Descriptors: one(strings.Repeat(apiKeyMarker, 30), "v")},
		{Domain: "", Descriptors: one("api_key", "sk-"+apiKeyMarker+"-no-domain")},
		{Domain: strings.Repeat(apiKeyMarker, 30), Descriptors: one("api_key", "x")},
	}
}

// At --log-level debug, in text and JSON, the failures that log (a
// backend error whose message quotes the API key, a panic whose value
// quotes it, invalid requests, a rule file that stops loading) log what
// happened without the request's values; the trace spans of those calls
// hold none either. The hostile backend stands in for the DynamoDB one,
// whose errors quote the entity in the same way (the DynamoDB test below
// has the real thing).
func TestLogsKeepRequestValuesOut(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			dir := t.TempDir()
			rules := filepath.Join(dir, "api.yaml")
			if err := os.WriteFile(rules, []byte(rulesSecurity), 0o644); err != nil {
				t.Fatal(err)
			}
			var logs syncBuffer
			log, err := newLogger(&logs, "debug", format)
			if err != nil {
				t.Fatal(err)
			}
			spans := tracetest.NewInMemoryExporter()
			o := testOptions(dir)
			o.logLevel, o.logFormat = "debug", format
			o.spanExporter, o.traceSampling = spans, 1
			o.decorate = func(be backend.Backend) backend.Backend { return hostileBackend{be} }
			s, cancel, done := startLoggingServer(t, o, log)
			c := dial(t, s.grpcLn.Addr().String())

			if _, err := ask(c, "api", "api_key", "sk-"+apiKeyMarker+"-ok"); err != nil {
				t.Fatalf("a good request: %v", err)
			}
			_, err = ask(c, "api", "api_key", "fail-"+apiKeyMarker)
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("a failing backend: %v, want UNAVAILABLE", err)
			}
			// The status message goes to Envoy (and its logs) and into
			// the call's span.
			noSecret(t, "the UNAVAILABLE status message", status.Convert(err).Message(), apiKeyMarker)
			if _, err := ask(c, "api", "api_key", "panic-"+apiKeyMarker); status.Code(err) != codes.Internal {
				t.Fatalf("a panicking backend: %v, want INTERNAL", err)
			}
			for i, req := range hostileRequests() {
				if _, err := send(c, req); status.Code(err) != codes.InvalidArgument {
					t.Errorf("invalid request %d: %v, want INVALID_ARGUMENT", i, err)
				} else {
					noSecret(t, fmt.Sprintf("INVALID_ARGUMENT message %d", i), status.Convert(err).Message(), apiKeyMarker)
				}
			}
			if err := os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: fortnight}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, 10*time.Second, "the broken rule file noticed", func() bool { return s.rules.Stats().Failed > 0 })
			recorded := spans.GetSpans() // before shutdown, which empties the exporter
			cancel()
			if err := <-done; err != nil {
				t.Errorf("shutdown: %v", err)
			}
			done <- nil

			out := logs.String()
			for _, want := range []string{
				"backend failed; applying failure policy", "ThrottlingException", // the warning
				"backend error", "DynamoDB.UpdateItem", "REQ-7", "http_status", // the debug line's typed fields
				"panic in gRPC handler", "panic_type", // the panic: its type
				"mapping config reload failed", "fortnight",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("the log lacks %q:\n%s", want, out)
				}
			}
			noSecret(t, format+" log", out, apiKeyMarker)
			for _, sp := range recorded {
				text := fmt.Sprint(sp.Name, sp.Status, sp.Attributes, sp.Events)
				noSecret(t, "span "+sp.Name, text, apiKeyMarker)
			}
			if len(recorded) == 0 {
				t.Error("no span recorded at trace sampling 1")
			}
		})
	}
}

// The same on DynamoDB Local, with `sluice serve` as a process of its own
// so that all it writes is read, the AWS SDK's own logger included: AWS
// credentials in the environment, API keys in requests, and the backend
// failing for real twice (the table deleted, then the endpoint dead),
// besides invalid requests and a broken rule file.
func TestLogsKeepSecretsOutOnDynamoDB(t *testing.T) {
	srv, dir, _ := dynamoDBServeEnv(t)
	rules := filepath.Join(dir, "api.yaml")
	setAWSSecrets(t)
	target := strings.TrimPrefix(srv.Endpoint(), "http://")
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			if err := os.WriteFile(rules, []byte(rulesSecurity), 0o644); err != nil {
				t.Fatal(err)
			}
			table := dynamodbtest.TableName(t)
			if out, code := sluiceProcess(t, "table", "create", "--table", table, "--region", "us-east-1", "--endpoint", srv.Endpoint()); code != 0 {
				t.Fatalf("table create: exit %d\n%s", code, out)
			}
			proxy, err := dynamodbtest.NewProxy(target)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { proxy.Close() })
			p := startServeProcess(t, "--backend", "dynamodb", "--table", table, "--region", "us-east-1",
				"--endpoint", proxy.Endpoint(), "--config-dir", dir, "--log-level", "debug", "--log-format", format,
				"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0")
			c := dial(t, p.addrs["grpc"])

			if resp, err := ask(c, "api", "api_key", "sk-"+apiKeyMarker+"-1"); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("a good request: %v %v\n%s", resp, err, p.out.String())
			}
			for i, req := range hostileRequests() {
				if _, err := send(c, req); status.Code(err) != codes.InvalidArgument {
					t.Errorf("invalid request %d: %v, want INVALID_ARGUMENT", i, err)
				}
			}
			_, metrics := get(t, "http://"+p.addrs["http"]+"/metrics")
			noSecret(t, "/metrics", metrics, apiKeyMarker, credMarker)
			_, config := get(t, "http://"+p.addrs["debug"]+"/debug/config")
			noSecret(t, "/debug/config", config, apiKeyMarker, credMarker)

			// The table goes: DynamoDB answers ResourceNotFoundException.
			if _, err := srv.Client(t.Context()).DeleteTable(t.Context(), &dynamodb.DeleteTableInput{TableName: aws.String(table)}); err != nil {
				t.Fatal(err)
			}
			_, err = ask(c, "api", "api_key", "sk-"+apiKeyMarker+"-2")
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("on a deleted table: %v, want UNAVAILABLE", err)
			}
			noSecret(t, "the UNAVAILABLE status message", status.Convert(err).Message(), apiKeyMarker, credMarker)
			// The endpoint dies: connections are refused. The first call
			// may instead find its pooled connection cut under it, an
			// error without a network address (seen on a busy machine);
			// the next one dials and is refused.
			proxy.Close()
			waitUntil(t, 10*time.Second, "a refused connection logged", func() bool {
				if _, err := ask(c, "api", "api_key", "sk-"+apiKeyMarker+"-3"); status.Code(err) != codes.Unavailable {
					t.Fatalf("on a dead endpoint: %v, want UNAVAILABLE", err)
				}
				return strings.Contains(p.out.String(), "network")
			})
			if err := os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: fortnight}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, 10*time.Second, "the broken rule file logged", func() bool { return strings.Contains(p.out.String(), "mapping config reload failed") })

			out := p.stop(t)
			for _, want := range []string{"backend failed; applying failure policy", "backend error",
				"ResourceNotFoundException", "DynamoDB.BatchGetItem", "network", "shutting down"} {
				if !strings.Contains(out, want) {
					t.Errorf("the output lacks %q:\n%s", want, out)
				}
			}
			noSecret(t, format+" output of sluice serve", out, apiKeyMarker, credMarker)
		})
	}
}

// The operator commands print neither the AWS secret access key nor the
// session token, whether they succeed or fail (a missing table, a dead
// endpoint, credentials that are half there). They run as processes, so
// that what the AWS SDK prints by itself is read too.
func TestAdminCommandsKeepCredentialsOut(t *testing.T) {
	srv := dynamodbtest.Require(t)
	awsEnv(t)
	setAWSSecrets(t)
	table := dynamodbtest.TableName(t)
	at := []string{"--table", table, "--region", "us-east-1", "--endpoint", srv.Endpoint()}
	dead, err := dynamodbtest.NewProxy("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	dead.Close() // its address now refuses connections
	for _, c := range []struct {
		args []string
		code int
	}{
		{append([]string{"table", "create"}, at...), 0},
		{append([]string{"limits", "set", "--system", "rpm=100/min"}, at...), 0},
		{append([]string{"limits", "set", "--entity", "acme", "--resource", "chat", "rpm=10/min"}, at...), 0},
		{append([]string{"limits", "get", "--system", "-o", "json"}, at...), 0},
		{append([]string{"limits", "list", "-o", "yaml"}, at...), 0},
		{append([]string{"entity", "set", "acme", "--parent", "team"}, at...), 0},
		{append([]string{"entity", "get", "acme"}, at...), 0},
		{append([]string{"buckets", "list", "--resource", "chat"}, at...), 0},
		{[]string{"limits", "get", "--system", "--table", table + "-missing", "--region", "us-east-1", "--endpoint", srv.Endpoint()}, 1},
		{[]string{"limits", "list", "--table", table, "--region", "us-east-1", "--endpoint", dead.Endpoint()}, 1},
		{[]string{"table", "create", "--table", table + "-dead", "--region", "us-east-1", "--endpoint", dead.Endpoint()}, 1},
	} {
		out, code := sluiceProcess(t, c.args...)
		if code != c.code {
			t.Errorf("sluice %s: exit %d, want %d\n%s", strings.Join(c.args, " "), code, c.code, out)
		}
		noSecret(t, "sluice "+strings.Join(c.args, " "), out, credMarker)
	}
	// Half the credentials: the SDK refuses, and says so without them.
	unsetEnv(t, "AWS_ACCESS_KEY_ID")
	out, code := sluiceProcess(t, append([]string{"limits", "get", "--system"}, at...)...)
	if code != 1 {
		t.Errorf("without an access key ID: exit %d, want 1\n%s", code, out)
	}
	noSecret(t, "sluice limits get without an access key ID", out, credMarker)
}
