package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectormetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/sluice-rl/sluice/certs/certstest"
)

// scrape reads /metrics into "name{label=value,...}" -> value, labels
// sorted; a histogram gives name_count and name_sum.
func scrape(t *testing.T, s *server) (map[string]float64, string) {
	t.Helper()
	return scrapeAddr(t, s.httpLn.Addr().String())
}

// scrapeAddr is scrape of the /metrics at addr.
func scrapeAddr(t *testing.T, addr string) (map[string]float64, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw strings.Builder
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(teeReader{resp.Body, &raw})
	if err != nil {
		t.Fatalf("/metrics is not the Prometheus text format: %v", err)
	}
	out := map[string]float64{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(labels)
			key := name + "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[strings.Replace(key, "{", "_count{", 1)] = float64(m.GetHistogram().GetSampleCount())
				out[strings.Replace(key, "{", "_sum{", 1)] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out, raw.String()
}

type teeReader struct {
	r interface{ Read([]byte) (int, error) }
	w *strings.Builder
}

func (t teeReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	t.w.Write(p[:n])
	return n, err
}

const rulesMetrics = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: plan
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
`

// After known traffic, /metrics holds exactly what happened.
func TestMetricsAfterKnownTraffic(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(rulesMetrics), 0o644); err != nil {
		t.Fatal(err)
	}
	s, _, _ := startTestServer(t, testOptions(dir))
	c := dial(t, s.grpcLn.Addr().String())
	// 2 a minute per address: one with a token to spare, one that
	// spends the last (near the limit), one over. The answers are not
	// read: the metrics must tell what they were.
	for range 3 {
		ask(c, "edge", "remote_address", "198.51.100.7")
	}
	ask(c, "edge", "plan", "gold")
	ask(c, "edge", "nomatch", "x")
	ask(c, "attacker-chosen-domain", "remote_address", "198.51.100.7")
	ask(c, "edge") // no descriptors: INVALID_ARGUMENT

	got, raw := scrape(t, s)
	want := map[string]float64{
		`sluice_decisions_total{code=ok,domain=edge,rule=edge/remote_address}`:            1,
		`sluice_decisions_total{code=near_limit,domain=edge,rule=edge/remote_address}`:    1,
		`sluice_decisions_total{code=over_limit,domain=edge,rule=edge/remote_address}`:    1,
		`sluice_decisions_total{code=ok,domain=edge,rule=edge/plan}`:                      1,
		`sluice_decisions_total{code=unmatched,domain=edge,rule=}`:                        1,
		`sluice_detailed_decisions_total{code=ok,domain=edge,entity=gold,rule=edge/plan}`: 1,
		`sluice_request_duration_seconds_count{domain=edge,grpc_code=OK}`:                 5,
		`sluice_request_duration_seconds_count{domain=_unknown_,grpc_code=OK}`:            1,
		`sluice_request_duration_seconds_count{domain=edge,grpc_code=InvalidArgument}`:    1,
		`sluice_backend_call_duration_seconds_count{backend=memory,operation=decide}`:     4,
		`sluice_bucket_writes_total{ttl=set}`:                                             3,
		// 2 a minute fills in 60 s: TTL 7 x 60 s, three times.
		`sluice_bucket_ttl_seconds_count{}`:          3,
		`sluice_bucket_ttl_seconds_sum{}`:            3 * 420,
		`sluice_config_reloads_total{result=ok}`:     1,
		`sluice_config_reloads_total{result=failed}`: 0,
	}
	var diffs []string
	for k, v := range want {
		if got[k] != v {
			diffs = append(diffs, fmt.Sprintf("%s = %v, want %v", k, got[k], v))
		}
	}
	if len(diffs) > 0 {
		slices.Sort(diffs)
		t.Errorf("metrics:\n%s\nscraped:\n%s", strings.Join(diffs, "\n"), raw)
	}
	// Request data never becomes a label, unless a rule asks
	// (detailed_metric: "gold" above).
	for _, leak := range []string{"198.51.100.7", "attacker-chosen-domain", "nomatch"} {
		if strings.Contains(raw, leak) {
			t.Errorf("/metrics carries request data %q", leak)
		}
	}
	// Every metric docs/metrics.md documents is served, and every one served is
	// documented.
	checkMetricsDocumented(t, got, "memory")
}

// checkMetricsDocumented compares the families scraped with docs/metrics.md's
// metrics table. Rows for the DynamoDB backend must be served only when
// backendName is dynamodb, rows for the stored backends' config cache only
// when it is not memory; rows that say they appear with the first event
// of their kind may be missing.
func checkMetricsDocumented(t *testing.T, scraped map[string]float64, backendName string) {
	t.Helper()
	documented := readmeMetrics(t)
	served := map[string]bool{}
	for k := range scraped {
		name := k[:strings.IndexByte(k, '{')]
		name = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_count"), "_sum"), "_bucket")
		served[name] = true
	}
	for name := range served {
		ours := strings.HasPrefix(name, "sluice_") || strings.HasPrefix(name, "ratelimit_service_")
		if _, ok := documented[name]; ours && !ok {
			t.Errorf("metric %s is served but not in docs/metrics.md's table", name)
		}
	}
	for name, row := range documented {
		optional := strings.Contains(row, "appears with the first") || strings.Contains(row, "with `--tls-cert` only") ||
			(strings.Contains(row, "with `--ratelimit-metrics` only") && !served["ratelimit_service_rate_limit_total_hits"]) ||
			(strings.Contains(row, "DynamoDB backend only") && backendName != "dynamodb") ||
			(strings.Contains(row, "Redis backend only") && backendName != "redis") ||
			(strings.Contains(row, "DynamoDB and Redis backends") && backendName == "memory") ||
			strings.Contains(row, "with shares that move only")
		if !served[name] && !optional {
			t.Errorf("docs/metrics.md documents %s, which is not served", name)
		}
	}
}

// readmeMetrics lists the metrics in docs/metrics.md's table, each with its
// row.
func readmeMetrics(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Metrics\n")
	if !ok {
		t.Fatal("docs/metrics.md has no Metrics section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	out := map[string]string{}
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `sluice_") && !strings.HasPrefix(line, "| `ratelimit_service_") {
			continue
		}
		name := strings.TrimPrefix(line, "| `")
		name = name[:strings.IndexByte(name, '`')]
		out[name] = line
	}
	if len(out) < 10 {
		t.Fatalf("docs/metrics.md's table has %d rows", len(out))
	}
	return out
}

// A call's span continues the trace Envoy propagates (W3C or B3), names
// the domain and outcome, and has the backend call as its child. Calls
// without a trace are sampled at --trace-sampling (0 here: none).
func TestTraces(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(rulesMetrics), 0o644); err != nil {
		t.Fatal(err)
	}
	spans := tracetest.NewInMemoryExporter()
	o := testOptions(dir)
	o.spanExporter, o.traceSampling = spans, 0
	s, _, _ := startTestServer(t, o)
	c := dial(t, s.grpcLn.Addr().String())
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}}}}}

	for _, tc := range []struct {
		name    string
		md      []string
		traceID string
		parent  string
	}{
		{"w3c", []string{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
			"4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"},
		{"b3", []string{"x-b3-traceid", "80f198ee56343ba864fe8b2a57d3eff7", "x-b3-spanid", "e457b5a2e4d86bd1", "x-b3-sampled", "1"},
			"80f198ee56343ba864fe8b2a57d3eff7", "e457b5a2e4d86bd1"},
	} {
		spans.Reset()
		ctx := metadata.AppendToOutgoingContext(context.Background(), tc.md...)
		if _, err := c.ShouldRateLimit(ctx, req); err != nil {
			t.Fatal(err)
		}
		// The server's span ends as gRPC finishes the call, which may be
		// a moment after the client has its answer.
		var got tracetest.SpanStubs
		waitUntil(t, 2*time.Second, tc.name+": the call's and the backend's spans", func() bool {
			got = spans.GetSpans()
			return len(got) >= 2
		})
		if len(got) != 2 {
			t.Fatalf("%s: %d spans, want the call's and the backend's: %v", tc.name, len(got), got)
		}
		backendSpan, call := got[0], got[1]
		if call.SpanKind != trace.SpanKindServer || call.SpanContext.TraceID().String() != tc.traceID || call.Parent.SpanID().String() != tc.parent {
			t.Errorf("%s: call span %s trace %s parent %s; want trace %s parent %s", tc.name, call.Name,
				call.SpanContext.TraceID(), call.Parent.SpanID(), tc.traceID, tc.parent)
		}
		attrs := map[string]string{}
		for _, a := range call.Attributes {
			attrs[string(a.Key)] = a.Value.String()
		}
		if attrs["sluice.domain"] != "edge" || attrs["sluice.outcome"] != "OK" {
			t.Errorf("%s: call span attributes %v", tc.name, attrs)
		}
		if backendSpan.Name != "memory.decide" || backendSpan.Parent.SpanID() != call.SpanContext.SpanID() {
			t.Errorf("%s: backend span %q with parent %s, want memory.decide under %s", tc.name, backendSpan.Name,
				backendSpan.Parent.SpanID(), call.SpanContext.SpanID())
		}
	}

	// No trace from Envoy, sampling 0: nothing recorded. A sampled call
	// after it shows its spans would have had time to end.
	spans.Reset()
	if _, err := c.ShouldRateLimit(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	sampled := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	if _, err := c.ShouldRateLimit(sampled, req); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 2*time.Second, "the sampled call's spans", func() bool { return len(spans.GetSpans()) >= 2 })
	if got := spans.GetSpans(); len(got) != 2 || got[0].SpanContext.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Errorf("at sampling 0, a call without a trace was recorded: %v", got)
	}

	// A trace Envoy chose not to sample is not sampled, even where
	// Sluice's own sampling would take every call.
	unsampledSpans := tracetest.NewInMemoryExporter()
	o.spanExporter, o.traceSampling = unsampledSpans, 1
	s1, _, _ := startTestServer(t, o)
	c1 := dial(t, s1.grpcLn.Addr().String())
	unsampled := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
	if _, err := c1.ShouldRateLimit(unsampled, req); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.ShouldRateLimit(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 2*time.Second, "the spans of the call without a trace", func() bool { return len(unsampledSpans.GetSpans()) >= 2 })
	for _, sp := range unsampledSpans.GetSpans() {
		if sp.SpanContext.TraceID().String() == "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("span %s recorded for a trace Envoy did not sample", sp.Name)
		}
	}
}

// gRPC over mutual TLS: `sluice check` with a client certificate from the
// CA gets an answer; without one, or in plaintext, it does not. The
// certificate's expiry is a metric.
func TestServeMutualTLS(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(rulesMetrics), 0o644); err != nil {
		t.Fatal(err)
	}
	pki := t.TempDir()
	ca := certstest.NewCA(t, "sluice-ca")
	caFile := filepath.Join(pki, "ca.pem")
	certstest.WriteFile(t, caFile, ca.PEM)
	serverCert, serverKey := ca.Issue(t, "server", true).Write(t, pki)
	clientCert, clientKey := ca.Issue(t, "envoy", false).Write(t, pki)
	strangerCert, strangerKey := certstest.NewCA(t, "other-ca").Issue(t, "stranger", false).Write(t, pki)

	o := testOptions(dir)
	o.tlsCert, o.tlsKey, o.tlsClientCA = serverCert, serverKey, caFile
	s, _, _ := startTestServer(t, o)
	check := []string{"check", "--grpc-addr", s.grpcLn.Addr().String(), "--domain", "edge", "--descriptor", "remote_address=10.0.0.1", "--timeout", "5s"}

	if out, code := sluice(t, append(check, "--tls-ca", caFile, "--tls-client-cert", clientCert, "--tls-client-key", clientKey)...); code != 0 || !strings.HasPrefix(out, "OK") {
		t.Fatalf("with a client certificate: exit %d\n%s", code, out)
	}
	for what, extra := range map[string][]string{
		"no client certificate":       {"--tls-ca", caFile},
		"a certificate of another CA": {"--tls-ca", caFile, "--tls-client-cert", strangerCert, "--tls-client-key", strangerKey},
		"plaintext":                   {"--timeout", "1s"},
	} {
		if out, code := sluice(t, append(check, extra...)...); code != 1 {
			t.Errorf("%s: exit %d, want 1\n%s", what, code, out)
		}
	}
	if out, code := sluice(t, append(check, "--tls-client-cert", clientCert)...); code != 2 {
		t.Errorf("--tls-client-cert without --tls-ca: exit %d\n%s", code, out)
	}
	// The quota service shares the port, and its TLS.
	watch := []string{"quota", "watch", "--grpc-addr", s.grpcLn.Addr().String(), "--domain", "edge", "--bucket", "plan=gold", "--duration", "1s"}
	if out, code := sluice(t, append(watch, "--tls-ca", caFile, "--tls-client-cert", clientCert, "--tls-client-key", clientKey)...); code != 0 || !strings.Contains(out, "plan=gold") {
		t.Errorf("quota watch with a client certificate: exit %d\n%s", code, out)
	}
	if out, code := sluice(t, append(watch, "--tls-ca", caFile)...); code == 0 || strings.Contains(out, "plan=gold") {
		t.Errorf("quota watch without a client certificate: exit %d\n%s", code, out)
	}

	got, _ := scrape(t, s)
	if exp := got["sluice_tls_certificate_expiry_seconds{}"]; exp < float64(time.Now().Add(11*time.Hour).Unix()) {
		t.Errorf("certificate expiry metric %v", exp)
	}
	if got["sluice_tls_reloads_total{result=ok}"] != 1 {
		t.Errorf("tls reloads %v", got["sluice_tls_reloads_total{result=ok}"])
	}
	checkMetricsDocumented(t, got, "memory")

	// Flags that do not go together stop serve before it serves.
	o = testOptions(dir)
	o.tlsCert = serverCert
	if _, err := startServer(context.Background(), o, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--tls-key") {
		t.Errorf("--tls-cert alone: %v", err)
	}
}

// collector is an OTLP/gRPC receiver of traces and metrics that keeps the
// names it is sent.
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu      sync.Mutex
	spans   []string
	metrics []string
}

func (c *collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				c.spans = append(c.spans, sp.GetName())
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

type metricsReceiver struct {
	collectormetrics.UnimplementedMetricsServiceServer
	c *collector
}

func (m metricsReceiver) Export(_ context.Context, req *collectormetrics.ExportMetricsServiceRequest) (*collectormetrics.ExportMetricsServiceResponse, error) {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	for _, rm := range req.GetResourceMetrics() {
		for _, sm := range rm.GetScopeMetrics() {
			for _, mt := range sm.GetMetrics() {
				m.c.metrics = append(m.c.metrics, mt.GetName())
			}
		}
	}
	return &collectormetrics.ExportMetricsServiceResponse{}, nil
}

// With --otlp-endpoint, traces and metrics reach an OTLP collector; on
// shutdown what is pending is flushed.
func TestOTLPExport(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, col)
	collectormetrics.RegisterMetricsServiceServer(srv, metricsReceiver{c: col})
	go srv.Serve(ln)
	defer srv.Stop()

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(rulesMetrics), 0o644); err != nil {
		t.Fatal(err)
	}
	o := testOptions(dir)
	o.otlpEndpoint, o.otlpInsecure, o.traceSampling = ln.Addr().String(), true, 1
	s, stop, _ := startTestServer(t, o)
	check := []string{"check", "--grpc-addr", s.grpcLn.Addr().String(), "--domain", "edge", "--descriptor", "remote_address=10.0.0.1"}
	if out, code := sluice(t, check...); code != 0 {
		t.Fatalf("check: exit %d\n%s", code, out)
	}
	stop() // shutdown flushes the exporters
	waitUntil(t, 10*time.Second, "the collector to get spans memory.decide and ShouldRateLimit, metrics sluice.decisions and sluice.request.duration", func() bool {
		col.mu.Lock()
		spans, metrics := strings.Join(col.spans, " "), strings.Join(col.metrics, " ")
		col.mu.Unlock()
		return strings.Contains(spans, "memory.decide") && strings.Contains(spans, "ShouldRateLimit") &&
			strings.Contains(metrics, "sluice.decisions") && strings.Contains(metrics, "sluice.request.duration")
	})
}

// rulesEnvoyGateway are rules as Envoy Gateway writes them (a route's
// descriptor, then the client's masked address), and the other shapes a
// stats key takes.
const rulesEnvoyGateway = `domain: default/eg/http
descriptors:
  - key: httproute/default/backend/rule/0/match/-1
    value: httproute/default/backend/rule/0/match/-1
    descriptors:
      - key: masked_remote_address
        value: 0.0.0.0/0
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: httproute/default/shadow/rule/0/match/-1
    value: httproute/default/shadow/rule/0/match/-1
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: remote_address
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: a
    descriptors:
      - key: b
        descriptors:
          - key: c
            rate_limit: {unit: minute, requests_per_unit: 10}
`

// With --ratelimit-metrics, each limited descriptor is counted under the
// names and labels Envoy Gateway's dashboards read, by hits, on the
// --metrics-addr listener as on the HTTP one.
func TestEnvoyproxyMetricNames(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "eg.yaml"), []byte(rulesEnvoyGateway), 0o644); err != nil {
		t.Fatal(err)
	}
	o := testOptions(dir)
	o.ratelimitMetrics, o.metricsAddr = true, "127.0.0.1:0"
	s, _, _ := startTestServer(t, o)
	c := dial(t, s.grpcLn.Addr().String())
	const domain, route, shadow = "default/eg/http", "httproute/default/backend/rule/0/match/-1", "httproute/default/shadow/rule/0/match/-1"
	call := func(hits uint32, kv ...string) {
		t.Helper()
		d := &rlv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		if _, err := send(c, &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: []*rlv3.RateLimitDescriptor{d}}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		call(0, route, route, "masked_remote_address", "0.0.0.0/0") // 1 a minute: one within, one over
		call(0, shadow, shadow)                                     // the same, in shadow mode
	}
	call(3, "remote_address", "10.1.2.3") // 10 a minute: 3 hits, 7 left
	call(6, "remote_address", "10.1.2.3") // 1 left: near the limit
	call(1, "a", "x", "b", "y", "c", "z") // a four-part key: no series
	call(1, "nomatch", "x")

	got, raw := scrapeAddr(t, s.metricsLn.Addr().String())
	masked := fmt.Sprintf("domain=%s,key1=%s_%s,key2=masked_remote_address_0_0_0_0/0", domain, route, route)
	// key2 is empty for a two-part key: Prometheus stores no label.
	shadowed := fmt.Sprintf("domain=%s,key1=%s_%s,key2=", domain, shadow, shadow)
	address := fmt.Sprintf("domain=%s,key1=remote_address_10_1_2_3,key2=", domain)
	want := map[string]float64{
		"ratelimit_service_rate_limit_total_hits{" + masked + "}":     2,
		"ratelimit_service_rate_limit_within_limit{" + masked + "}":   1,
		"ratelimit_service_rate_limit_over_limit{" + masked + "}":     1,
		"ratelimit_service_rate_limit_near_limit{" + masked + "}":     1, // the last token (envoyproxy/ratelimit counts it too)
		"ratelimit_service_rate_limit_shadow_mode{" + masked + "}":    0,
		"ratelimit_service_rate_limit_total_hits{" + shadowed + "}":   2,
		"ratelimit_service_rate_limit_within_limit{" + shadowed + "}": 1,
		"ratelimit_service_rate_limit_over_limit{" + shadowed + "}":   1,
		"ratelimit_service_rate_limit_near_limit{" + shadowed + "}":   1,
		"ratelimit_service_rate_limit_shadow_mode{" + shadowed + "}":  1,
		"ratelimit_service_rate_limit_total_hits{" + address + "}":    9,
		"ratelimit_service_rate_limit_within_limit{" + address + "}":  9,
		"ratelimit_service_rate_limit_near_limit{" + address + "}":    6,
		"ratelimit_service_rate_limit_over_limit{" + address + "}":    0,
	}
	var diffs []string
	series := 0
	for k, v := range got {
		if !strings.HasPrefix(k, "ratelimit_service_") {
			continue
		}
		series++
		if _, ok := want[k]; !ok && v != 0 || strings.Contains(k, "key1=a") {
			diffs = append(diffs, fmt.Sprintf("unexpected %s = %v", k, v))
		}
	}
	for k, v := range want {
		if w, ok := got[k]; !ok || w != v {
			diffs = append(diffs, fmt.Sprintf("%s = %v (served: %v), want %v", k, w, ok, v))
		}
	}
	if series != 15 {
		diffs = append(diffs, fmt.Sprintf("%d ratelimit_service series, want 5 names x 3 keys", series))
	}
	if len(diffs) > 0 {
		slices.Sort(diffs)
		t.Errorf("metrics:\n%s\nscraped:\n%s", strings.Join(diffs, "\n"), raw)
	}
	// The names are exactly the dashboards' (no _total), and the HTTP
	// address serves the same metrics.
	if !strings.Contains(raw, "\nratelimit_service_rate_limit_over_limit{") {
		t.Errorf("no ratelimit_service_rate_limit_over_limit series:\n%s", raw)
	}
	if same, _ := scrape(t, s); same["ratelimit_service_rate_limit_total_hits{"+masked+"}"] != 2 {
		t.Errorf("the HTTP address's /metrics lacks the counters")
	}
	checkMetricsDocumented(t, got, "memory")
}
