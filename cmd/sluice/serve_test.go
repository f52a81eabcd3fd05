package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/sluice-rl/sluice/backend"
	ddb "github.com/sluice-rl/sluice/backend/dynamodb"
	"github.com/sluice-rl/sluice/backend/dynamodb/dynamodbtest"
	"github.com/sluice-rl/sluice/descriptors"
)

const rulesV1 = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
`

const rulesV2 = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 50}
`

// testOptions are serve's defaults, as its flags give them, with every
// listener on a free loopback port and the rules read from dir.
func testOptions(dir string) serveOptions {
	var o serveOptions
	o.register(pflag.NewFlagSet("serve", pflag.PanicOnError))
	o.grpcAddr, o.httpAddr, o.debugAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	o.configDir, o.shutdownTimeout = dir, 5*time.Second
	return o
}

func startTestServer(t *testing.T, o serveOptions) (*server, context.CancelFunc, chan error) {
	t.Helper()
	return startLoggingServer(t, o, slog.New(slog.DiscardHandler))
}

// startLoggingServer is startTestServer logging to log. A test that stops
// the server itself (cancel, then receive from done) puts a value back on
// done for the clean-up to find.
func startLoggingServer(t *testing.T, o serveOptions, log *slog.Logger) (*server, context.CancelFunc, chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := startServer(ctx, o, log)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.wait(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return s, cancel, done
}

// dialConn is a plaintext gRPC connection to the server at addr, closed
// at the test's end.
func dialConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// dial is a RateLimitService client of the server at addr, over
// plaintext gRPC, closed at the test's end.
func dial(t *testing.T, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	return rlsv3.NewRateLimitServiceClient(dialConn(t, addr))
}

// sluice runs `sluice args...` in this process and returns what it wrote,
// stdout then stderr, and its exit code. The command gets 30 s, as
// sluiceProcess does: a serve that wrongly accepted a bad flag is stopped
// then, exiting 0, instead of hanging the test.
func sluice(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	code := run(ctx, args, &out, &errOut)
	return out.String() + errOut.String(), code
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestServeEndToEnd(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "edge.yaml")
	if err := os.WriteFile(rules, []byte(rulesV1), 0o644); err != nil {
		t.Fatal(err)
	}
	s, cancel, done := startTestServer(t, testOptions(dir))
	grpcAddr := s.grpcLn.Addr().String()
	httpURL := "http://" + s.httpLn.Addr().String()
	debugURL := "http://" + s.debugLn.Addr().String()

	conn := dialConn(t, grpcAddr)
	ctx := context.Background()
	hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil || hr.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health: %v %v", hr, err)
	}
	if services := listServices(t, conn); !strings.Contains(services, "envoy.service.ratelimit.v3.RateLimitService") {
		t.Fatalf("reflection lists %s", services)
	}
	if code, body := get(t, httpURL+"/healthz"); code != 200 {
		t.Fatalf("/healthz %d %s", code, body)
	}
	if code, body := get(t, httpURL+"/readyz"); code != 200 {
		t.Fatalf("/readyz %d %s", code, body)
	}
	if out, code := sluice(t, "health", "--http-addr", s.httpLn.Addr().String()); code != 0 || out != "ready\n" {
		t.Fatalf("sluice health: exit %d\n%s", code, out)
	}

	checkArgs := []string{"check", "--grpc-addr", grpcAddr, "--domain", "edge", "--descriptor", "remote_address=10.1.1.1"}
	for i := 0; i < 2; i++ {
		if out, code := sluice(t, checkArgs...); code != 0 || !strings.HasPrefix(out, "OK") {
			t.Fatalf("check %d: exit %d\n%s", i, code, out)
		}
	}
	out, code := sluice(t, checkArgs...)
	if code != 0 || !strings.HasPrefix(out, "OVER_LIMIT") || !strings.Contains(out, "2/minute") || !strings.Contains(out, "30s") {
		t.Fatalf("third check: exit %d\n%s", code, out)
	}

	var view configView
	_, body := get(t, debugURL+"/debug/config")
	if err := json.Unmarshal([]byte(body), &view); err != nil {
		t.Fatal(err)
	}
	if len(view.Rules) != 1 || view.Rules[0].Path != "edge/remote_address" || view.Decisions.OverLimit != 1 ||
		view.Rules[0].Source != "edge.yaml:3" || view.Reloads.OK != 1 {
		t.Fatalf("/debug/config: %s", body)
	}
	for _, key := range []string{`"fingerprint"`, `"reloads"`, `"ok"`, `"failed"`, `"last_ok"`, `"last_attempt"`, `"descriptors_over_limit"`} {
		if !strings.Contains(body, key) {
			t.Errorf("/debug/config lacks the documented key %s", key)
		}
	}

	// Hot reload from a real file: the raised limit applies to the next
	// decision, within the watcher's debounce.
	if err := os.WriteFile(rules, []byte(rulesV2), 0o644); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the new rules (50/minute) served after the edit", func() bool {
		out, _ = sluice(t, "check", "--grpc-addr", grpcAddr, "--domain", "edge", "--descriptor", "remote_address=10.9.9.9", "--hits", "0")
		return strings.Contains(out, "50/minute")
	})
	// A broken edit keeps the last good rules in force.
	if err := os.WriteFile(rules, []byte("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: fortnight}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the broken edit noticed", func() bool { return s.rules.Stats().Failed > 0 })
	if out, _ = sluice(t, "check", "--grpc-addr", grpcAddr, "--domain", "edge", "--descriptor", "remote_address=10.9.9.9", "--hits", "0"); !strings.Contains(out, "50/minute") {
		t.Fatalf("after a broken edit the last good rules are gone:\n%s", out)
	}

	// SIGTERM (here: the context) makes the server unready and stop.
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	done <- nil // for the cleanup
	if !s.shuttingDown.Load() {
		t.Fatal("not marked as shutting down")
	}
	if err := s.ready(ctx); err == nil {
		t.Fatal("ready while shut down")
	}
	if out, code := sluice(t, "health", "--http-addr", s.httpLn.Addr().String(), "--timeout", "500ms"); code != 1 {
		t.Fatalf("sluice health after shutdown: exit %d\n%s", code, out)
	}
}

func listServices(t *testing.T, conn *grpc.ClientConn) string {
	t.Helper()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer stream.CloseSend()
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	return strings.Join(names, " ")
}

func TestServeFailsFastOnBadSetup(t *testing.T) {
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "x.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limitt: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	good := t.TempDir()
	if err := os.WriteFile(filepath.Join(good, "x.yaml"), []byte(rulesV1), 0o644); err != nil {
		t.Fatal(err)
	}
	local := []string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", ""}
	cases := []struct {
		name string
		args []string
		env  map[string]string
		code int
		msg  string
	}{
		{"rules with an error", append([]string{"serve", "--config-dir", bad}, local...), nil, 1, "x.yaml:4"},
		{"missing rules dir", append([]string{"serve", "--config-dir", filepath.Join(bad, "nope")}, local...), nil, 1, "nope"},
		{"bad policy", append([]string{"serve", "--config-dir", good, "--on-backend-error", "maybe"}, local...), nil, 2, "maybe"},
		{"bad policy from env", append([]string{"serve", "--config-dir", good}, local...), map[string]string{"SLUICE_ON_BACKEND_ERROR": "maybe"}, 2, "maybe"},
		{"unknown backend", append([]string{"serve", "--config-dir", good, "--backend", "redis"}, local...), nil, 2, "redis"},
		{"bad overrides", append([]string{"serve", "--config-dir", good, "--overrides", filepath.Join(bad, "x.yaml")}, local...), nil, 1, "overrides"},
		{"bad log format", append([]string{"serve", "--config-dir", good, "--log-format", "xml"}, local...), nil, 2, "xml"},
		{"global region alone", append([]string{"serve", "--config-dir", good, "--global-region", "eu-west-1"}, local...), nil, 2, "go together"},
		{"global region not in the split", append([]string{"serve", "--config-dir", good, "--global-region", "mars", "--global-regions", "us-east-1=1"}, local...), nil, 2, "mars"},
		{"unknown flag", []string{"serve", "--grpc-adr", ":1"}, nil, 2, "grpc-adr"},
		{"check without domain", []string{"check", "--descriptor", "a=b"}, nil, 2, "--domain"},
		{"check bad descriptor", []string{"check", "--domain", "d", "--descriptor", "novalue"}, nil, 2, "key=value"},
	}
	for _, c := range cases {
		for k, v := range c.env {
			t.Setenv(k, v)
		}
		out, code := sluice(t, c.args...)
		if code != c.code || !strings.Contains(out, c.msg) {
			t.Errorf("%s: exit %d, want %d with %q:\n%s", c.name, code, c.code, c.msg, out)
		}
		for k := range c.env {
			os.Unsetenv(k)
		}
	}
}

// TestServeGlobalRule: a replica of a region weighted 1 in 4 answers a
// rule marked global with its quarter of the limit, over gRPC, and a rule
// not marked global with all of it.
func TestServeGlobalRule(t *testing.T) {
	dir := t.TempDir()
	rules := `domain: api
descriptors:
  - key: tenant
    global: true
    limits: [{name: rpm, rate: 400/min}]
  - key: ip
    limits: [{name: rpm, rate: 400/min}]
`
	if err := os.WriteFile(filepath.Join(dir, "api.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	o := testOptions(dir)
	o.global.region, o.global.regions = "eu-west-1", "us-east-1=3,eu-west-1=1"
	s, _, _ := startTestServer(t, o)
	client := dial(t, s.grpcLn.Addr().String())
	for key, want := range map[string]int{"tenant": 100, "ip": 400} {
		ok := 0
		for range 450 {
			resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
				Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: key, Value: "t1"}}}}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		// The refill while the calls run (7 tokens a second for the
		// whole limit) may add a few, on a busy machine.
		if ok < want || ok > want+want/20 {
			t.Errorf("%s: %d of 450 calls passed, want %d", key, ok, want)
		}
	}
	var view configView
	_, body := get(t, "http://"+s.debugLn.Addr().String()+"/debug/config")
	if err := json.Unmarshal([]byte(body), &view); err != nil {
		t.Fatal(err)
	}
	if len(view.Rules) != 2 {
		t.Fatalf("/debug/config shows %d rules, want 2", len(view.Rules))
	}
	for _, r := range view.Rules {
		if want := r.Path == "api/tenant"; r.Global != want {
			t.Errorf("/debug/config shows rule %s with global %v, want %v", r.Path, r.Global, want)
		}
	}
}

func TestFlagsFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(rulesV1), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SLUICE_CONFIG_DIR", dir)
	t.Setenv("SLUICE_SHADOW_MODE", "true")
	cmd := newServeCommand()
	if err := cmd.ParseFlags([]string{"--grpc-addr", "127.0.0.1:0"}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SLUICE_GRPC_ADDR", "example:1") // the command line wins
	if err := flagsFromEnv(cmd.Flags()); err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{"config-dir": dir, "shadow-mode": "true", "grpc-addr": "127.0.0.1:0", "http-addr": ":8080"} {
		if got := cmd.Flags().Lookup(flag).Value.String(); got != want {
			t.Errorf("--%s = %q, want %q", flag, got, want)
		}
	}
}

// dynamoDBServeEnv is what a serve test on DynamoDB Local needs: the
// server, AWS settings for it, a rules directory holding rulesV1, and a
// table name of the test's own (not created).
func dynamoDBServeEnv(t *testing.T) (srv *dynamodbtest.Server, dir, table string) {
	t.Helper()
	srv = dynamodbtest.Require(t)
	awsEnv(t)
	dir = t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(rulesV1), 0o644); err != nil {
		t.Fatal(err)
	}
	return srv, dir, dynamodbtest.TableName(t)
}

// serve on the DynamoDB backend: a missing table stops it at once with the
// fix; with the table it decides through DynamoDB Local.
func TestServeOnDynamoDB(t *testing.T) {
	srv, dir, table := dynamoDBServeEnv(t)
	local := []string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", "",
		"--config-dir", dir, "--backend", "dynamodb", "--table", table, "--region", "us-east-1", "--endpoint", srv.Endpoint()}

	out, code := sluice(t, append([]string{"serve"}, local...)...)
	if code != 1 || !strings.Contains(out, "sluice table create --table "+table) {
		t.Fatalf("serve on a missing table: exit %d\n%s", code, out)
	}
	if out, code := sluice(t, "serve", "--backend", "dynamodb", "--config-dir", dir); code != 2 || !strings.Contains(out, "--table") {
		t.Fatalf("serve without --table: exit %d\n%s", code, out)
	}
	if out, code := sluice(t, "table", "create", "--table", table, "--region", "us-east-1", "--endpoint", srv.Endpoint()); code != 0 {
		t.Fatalf("table create: exit %d\n%s", code, out)
	}

	o := testOptions(dir)
	o.backend, o.table, o.region, o.endpoint, o.keyPrefix = "dynamodb", table, "us-east-1", srv.Endpoint(), "e2e"
	s, _, _ := startTestServer(t, o)
	if code, body := get(t, "http://"+s.httpLn.Addr().String()+"/readyz"); code != 200 {
		t.Fatalf("/readyz %d %s", code, body)
	}
	args := []string{"check", "--grpc-addr", s.grpcLn.Addr().String(), "--domain", "edge", "--descriptor", "remote_address=10.1.1.1"}
	for i := 0; i < 2; i++ {
		if out, code := sluice(t, args...); code != 0 || !strings.HasPrefix(out, "OK") {
			t.Fatalf("check %d: exit %d\n%s", i, code, out)
		}
	}
	if out, code := sluice(t, args...); code != 0 || !strings.HasPrefix(out, "OVER_LIMIT") {
		t.Fatalf("third check: exit %d\n%s", code, out)
	}
	// The bucket is in the table, under the key prefix.
	item, err := srv.Client(t.Context()).GetItem(t.Context(), &dynamodb.GetItemInput{
		TableName: aws.String(table),
		Key: map[string]types.AttributeValue{
			"PK": &types.AttributeValueMemberS{Value: "e2e/ENTITY#10.1.1.1"},
			"SK": &types.AttributeValueMemberS{Value: "#BUCKET#edge/remote_address"},
		},
	})
	if err != nil || len(item.Item) == 0 {
		t.Fatalf("bucket item not found: %v %v", item, err)
	}
	// And on /metrics: three decisions, two writes, the table's capacity.
	got, raw := scrape(t, s)
	for k, ok := range map[string]bool{
		`sluice_backend_call_duration_seconds_count{backend=dynamodb,operation=decide}`:     got[`sluice_backend_call_duration_seconds_count{backend=dynamodb,operation=decide}`] == 3,
		`sluice_backend_call_duration_seconds_count{backend=dynamodb,operation=PutItem}`:    got[`sluice_backend_call_duration_seconds_count{backend=dynamodb,operation=PutItem}`] == 1,
		`sluice_backend_call_duration_seconds_count{backend=dynamodb,operation=UpdateItem}`: got[`sluice_backend_call_duration_seconds_count{backend=dynamodb,operation=UpdateItem}`] == 1,
		`sluice_bucket_writes_total{ttl=set}`:                                               got[`sluice_bucket_writes_total{ttl=set}`] == 2,
		`sluice_dynamodb_write_capacity_units_total{}`:                                      got[`sluice_dynamodb_write_capacity_units_total{}`] > 0,
		`sluice_config_cache_misses_total{}`:                                                got[`sluice_config_cache_misses_total{}`] == 1,
		`sluice_config_cache_hits_total{}`:                                                  got[`sluice_config_cache_hits_total{}`] == 2,
		`sluice_config_cache_size{}`:                                                        got[`sluice_config_cache_size{}`] == 1,
		`sluice_dynamodb_condition_retries_total{}`:                                         got[`sluice_dynamodb_condition_retries_total{}`] == 0,
		`sluice_dynamodb_local_answers_total{}`:                                             got[`sluice_dynamodb_local_answers_total{}`] == 1,
		`sluice_dynamodb_coalesced_decisions_total{}`:                                       got[`sluice_dynamodb_coalesced_decisions_total{}`] == 0,
	} {
		if !ok {
			t.Errorf("%s = %v\n%s", k, got[k], raw)
		}
	}
	checkMetricsDocumented(t, got, "dynamodb")

	// What DynamoDB cost is visible on /debug/config.
	view := s.describe()
	if view.DynamoDB == nil || view.DynamoDB.Calls["UpdateItem"] == 0 || view.DynamoDB.WriteUnits <= 0 || view.DynamoDB.CacheMisses == 0 {
		t.Fatalf("dynamodb costs not shown: %+v", view.DynamoDB)
	}
}

// heldBackend holds every decision, once it has said so on started,
// until the test closes release; then it asks the real one. The test
// decides when the calls end, not a timer.
type heldBackend struct {
	backend.Backend
	started chan<- struct{}
	release <-chan struct{}
}

func (b heldBackend) Decide(ctx context.Context, req *backend.Request) (backend.Decision, error) {
	b.started <- struct{}{}
	<-b.release
	return b.Backend.Decide(ctx, req)
}

// SIGTERM with calls in flight: readiness goes 503 at once, new calls are
// refused, and every call already in flight gets its answer.
func TestShutdownDrainsInFlightCalls(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(rulesV2), 0o644); err != nil {
		t.Fatal(err)
	}
	const inFlight = 20
	started, release := make(chan struct{}, inFlight), make(chan struct{})
	o := testOptions(dir)
	o.decorate = func(be backend.Backend) backend.Backend {
		return heldBackend{Backend: be, started: started, release: release}
	}
	s, stop, _ := startTestServer(t, o)
	// Released at the latest when the test ends, so that a failure above
	// does not leave the drain waiting.
	releaseAll := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseAll)
	c := dial(t, s.grpcLn.Addr().String())
	req := func(i int) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: fmt.Sprintf("10.0.0.%d", i)}}}}}
	}
	results := make(chan error, inFlight)
	for i := range inFlight {
		go func() {
			// A deadline of their own, longer than the probe's second
			// below: with none, the service gives a call 1 s, and beside
			// two busy loops the probe took that second and the held
			// calls' deadlines passed before their release.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := c.ShouldRateLimit(ctx, req(i))
			if err == nil && resp.OverallCode != rlsv3.RateLimitResponse_OK {
				err = fmt.Errorf("code %v", resp.OverallCode)
			}
			results <- err
		}()
	}
	for range inFlight {
		<-started // every call is inside the backend now
	}
	stop() // as SIGTERM does
	readyURL := "http://" + s.httpLn.Addr().String() + "/readyz"
	deadline := time.Now().Add(2 * time.Second)
	for !s.shuttingDown.Load() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if code, _ := get(t, readyURL); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz during the drain: %d, want 503", code)
	}
	// A new call is not served. It is refused (UNAVAILABLE) at once,
	// unless the client took the drain's GOAWAY first, reconnects and
	// waits: beside two busy loops it then waited until the drain's
	// timeout closed everything, taking the in-flight calls with it. So
	// it gets a second, well inside the drain.
	probe, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := c.ShouldRateLimit(probe, req(99)); status.Code(err) != codes.Unavailable && status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("a new call during the drain: %v, want it refused (UNAVAILABLE) or never answered", err)
	}
	releaseAll()
	for range inFlight {
		if err := <-results; err != nil {
			t.Errorf("an in-flight call was dropped: %v", err)
		}
	}
}

// pinger is a backend whose Ping answers from a list, then the last
// answer forever.
type pinger struct {
	backend.Backend
	answers []error
	calls   *int
}

func (p pinger) Ping(context.Context) error {
	i := min(*p.calls, len(p.answers)-1)
	*p.calls++
	return p.answers[i]
}

func (pinger) Close() error { return nil }

// Readiness waits for the backend's first answer, then stays: a later
// outage is the failure policy's business, not a reason to leave Envoy's
// endpoints. Shutdown ends it.
func TestReadinessLatchesOnTheFirstAnswer(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(rulesV1), 0o644); err != nil {
		t.Fatal(err)
	}
	rules, err := descriptors.Watch(t.Context(), dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	down := errors.New("connection refused")
	s := &server{rules: rules, backend: pinger{answers: []error{down, down, nil, down}, calls: &calls}}
	for i, want := range []bool{false, false, true, true, true} {
		if err := s.ready(t.Context()); (err == nil) != want {
			t.Fatalf("probe %d: %v, want ready=%v", i+1, err, want)
		}
	}
	if calls != 3 {
		t.Errorf("backend pinged %d times, want 3 (until it first answered)", calls)
	}
	s.shuttingDown.Store(true)
	if err := s.ready(t.Context()); err == nil {
		t.Error("ready while shutting down")
	}
}

// --deny-staleness 0 makes every denial ask the table, and
// --coalesce-writes=false, every decision write on its own; a negative
// staleness is a usage error. (The defaults are covered by
// TestServeOnDynamoDB: the denial there costs no call.)
func TestServeDynamoDBCostFlags(t *testing.T) {
	srv, dir, table := dynamoDBServeEnv(t)
	if out, code := sluice(t, "serve", "--backend", "dynamodb", "--table", table, "--config-dir", dir, "--deny-staleness", "-1s"); code != 2 || !strings.Contains(out, "--deny-staleness") {
		t.Fatalf("negative --deny-staleness: exit %d\n%s", code, out)
	}
	if out, code := sluice(t, "table", "create", "--table", table, "--region", "us-east-1", "--endpoint", srv.Endpoint()); code != 0 {
		t.Fatalf("table create: exit %d\n%s", code, out)
	}
	o := testOptions(dir)
	o.backend, o.table, o.region, o.endpoint = "dynamodb", table, "us-east-1", srv.Endpoint()
	o.denyStaleness, o.coalesceWrites = 0, false
	s, _, _ := startTestServer(t, o)
	args := []string{"check", "--grpc-addr", s.grpcLn.Addr().String(), "--domain", "edge", "--descriptor", "remote_address=10.9.9.9"}
	for i, want := range []string{"OK", "OK", "OVER_LIMIT", "OVER_LIMIT"} {
		if out, code := sluice(t, args...); code != 0 || !strings.HasPrefix(out, want) {
			t.Fatalf("check %d: exit %d, want %s\n%s", i, code, want, out)
		}
	}
	got, raw := scrape(t, s)
	if got[`sluice_backend_call_duration_seconds_count{backend=dynamodb,operation=GetItem}`] != 2 ||
		got[`sluice_dynamodb_local_answers_total{}`] != 0 {
		t.Fatalf("with --deny-staleness 0, want both denials read from the table and none answered locally\n%s", raw)
	}
	if d := s.backend.(*ddb.Backend); d.Stats().Coalesced.Load() != 0 {
		t.Fatalf("coalesced %d decisions with --coalesce-writes=false", d.Stats().Coalesced.Load())
	}
}

// The environment that configures serve also points health and check at
// it: SLUICE_HTTP_ADDR and SLUICE_GRPC_ADDR with an empty host (every
// interface) reach the local server, and serve's own TLS identity
// (SLUICE_TLS_CERT, SLUICE_TLS_KEY) is no client certificate of check's.
func TestToolsShareServesEnvironment(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(rulesV1), 0o644); err != nil {
		t.Fatal(err)
	}
	s, _, _ := startTestServer(t, testOptions(dir))
	t.Setenv("SLUICE_HTTP_ADDR", ":"+port(t, s.httpLn.Addr().String()))
	t.Setenv("SLUICE_GRPC_ADDR", "0.0.0.0:"+port(t, s.grpcLn.Addr().String()))
	t.Setenv("SLUICE_TLS_CERT", "/etc/sluice/tls/tls.crt")
	t.Setenv("SLUICE_TLS_KEY", "/etc/sluice/tls/tls.key")
	if out, code := sluice(t, "health"); code != 0 || out != "ready\n" {
		t.Fatalf("health from serve's environment: exit %d\n%s", code, out)
	}
	if out, code := sluice(t, "check", "--domain", "edge", "--descriptor", "remote_address=10.7.7.7"); code != 0 || !strings.HasPrefix(out, "OK") {
		t.Fatalf("check from serve's environment: exit %d\n%s", code, out)
	}
}
