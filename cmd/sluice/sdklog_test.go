package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	ddb "github.com/sluice-rl/sluice/backend/dynamodb"
)

// What the AWS SDK has to say goes through serve's logger: with
// --log-format json every line serve writes parses as JSON, the SDK's
// warnings included. DynamoDB Local is reached through a proxy that
// spoils each answer's Date header, which the SDK warns about.
func TestSDKWarningsJoinServesLog(t *testing.T) {
	srv, dir, table := dynamoDBServeEnv(t)
	if _, err := ddb.CreateTable(t.Context(), srv.Client(t.Context()), table); err != nil {
		t.Fatal(err)
	}
	target, err := url.Parse(srv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(r *http.Response) error {
		r.Header.Set("Date", "yesterday-ish")
		return nil
	}
	spoiled := httptest.NewServer(proxy)
	t.Cleanup(spoiled.Close)

	var out syncBuffer
	log, err := newLogger(&out, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	o := testOptions(dir)
	o.backend, o.table, o.region, o.endpoint = "dynamodb", table, "us-east-1", spoiled.URL
	s, cancel, done := startLoggingServer(t, o, log)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{{
		Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.9.9.9"}},
	}}}
	if _, err := dial(t, s.grpcLn.Addr().String()).ShouldRateLimit(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	done <- nil

	sdkLines := 0
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("a line of serve's JSON log is not JSON: %q", line)
		}
		if rec["component"] == "aws-sdk" {
			sdkLines++
			if rec["level"] != "WARN" || !strings.Contains(rec["msg"].(string), "Date header") {
				t.Errorf("SDK line %q: want a WARN about the Date header", line)
			}
		}
	}
	if sdkLines == 0 {
		t.Fatalf("no SDK warning in serve's log:\n%s", out.String())
	}
}
