package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// `sluice quota watch` against a running serve prints what its quota
// service assigns: a token bucket within the rule's limit for a bucket a
// rule limits, ALLOW_ALL for one no rule matches; and serve refuses quota
// flags that would not mean what they say.
func TestQuotaWatch(t *testing.T) {
	dir := t.TempDir()
	rules := "domain: quota\ndescriptors:\n  - key: api\n    rate_limit: {unit: second, requests_per_unit: 40}\n"
	if err := os.WriteFile(filepath.Join(dir, "quota.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	s, _, _ := startTestServer(t, testOptions(dir))
	out, code := sluice(t, "quota", "watch", "--grpc-addr", s.grpcLn.Addr().String(), "--domain", "quota",
		"--bucket", "api=search", "--bucket", "other=x", "--duration", "1500ms")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	t.Log(out)
	var bucket, allow bool
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.Contains(line, "api=search") && strings.Contains(line, "token_bucket") && strings.Contains(line, "per 1s"):
			bucket = true
		case strings.Contains(line, "other=x") && strings.Contains(line, "ALLOW_ALL"):
			allow = true
		}
	}
	if !bucket || !allow {
		t.Errorf("want a token bucket for api=search and ALLOW_ALL for other=x:\n%s", out)
	}
	for deadline := time.Now().Add(5 * time.Second); s.quota.Stats().Streams != 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if st := s.quota.Stats(); st.Streams != 0 || st.TokenBuckets == 0 || st.Leased == 0 {
		t.Errorf("after the watch: %+v", st)
	}

	for _, bad := range [][]string{
		{"--rlqs-assignment-ttl", "1500ms"},
		{"--rlqs-assignment-ttl", "0s"},
		{"--rlqs-max-streams", "0"},
		{"--rlqs-max-buckets", "-1"},
	} {
		out, code := sluice(t, append([]string{"serve", "--config-dir", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", ""}, bad...)...)
		if code != 2 || !strings.Contains(out, bad[0]) {
			t.Errorf("serve %v: exit %d, %s", bad, code, out)
		}
	}
}

// Shutting down ends the quota streams at once with UNAVAILABLE (their
// Envoys reconnect elsewhere) instead of waiting --shutdown-timeout for
// streams that never end on their own.
func TestShutdownEndsQuotaStreams(t *testing.T) {
	dir := t.TempDir()
	rules := "domain: quota\ndescriptors:\n  - key: api\n    rate_limit: {unit: second, requests_per_unit: 40}\n"
	if err := os.WriteFile(filepath.Join(dir, "quota.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	o := testOptions(dir)
	o.shutdownTimeout = 10 * time.Second
	s, cancel, done := startLoggingServer(t, o, slog.New(slog.DiscardHandler))
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(dialConn(t, s.grpcLn.Addr().String())).StreamRateLimitQuotas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"api": "x"}}, TimeElapsed: durationpb.New(0), NumRequestsAllowed: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	cancel()
	err = <-done
	done <- err
	if took := time.Since(begin); took > 5*time.Second {
		t.Errorf("shutdown took %v with a quota stream open, want well under --shutdown-timeout 10s", took)
	}
	for {
		if _, err = stream.Recv(); err != nil {
			break
		}
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("the quota stream ended with %v, want UNAVAILABLE", err)
	}
}
