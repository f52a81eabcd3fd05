package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
