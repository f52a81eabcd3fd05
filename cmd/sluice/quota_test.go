package main

import (
	"os"
	"path/filepath"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// --quota-mode and --response-dynamic-metadata reach the answers of a
// running `sluice serve`: with one plain limit spent and another within,
// the request passes in quota mode (and fails without it), and the answer
// carries the domain and the metadata of the rule that passed.
func TestServeQuotaModeAndDynamicMetadata(t *testing.T) {
	dir := t.TempDir()
	rules := "domain: q\ndescriptors:\n" +
		"  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 0}\n" +
		"  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 5}\n    metadata: {backend: b}\n"
	if err := os.WriteFile(filepath.Join(dir, "q.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	local := []string{"--config-dir", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", ""}
	for _, c := range []struct {
		flags []string
		want  rlsv3.RateLimitResponse_Code
		meta  bool
	}{
		{nil, rlsv3.RateLimitResponse_OVER_LIMIT, false},
		{[]string{"--quota-mode", "--response-dynamic-metadata"}, rlsv3.RateLimitResponse_OK, true},
	} {
		p := startServeProcess(t, append(local, c.flags...)...)
		resp, err := ask(dial(t, p.addrs["grpc"]), "q", "a", "x", "b", "y")
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != c.want || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("%v: %v", c.flags, resp)
		}
		md := resp.GetDynamicMetadata().GetFields()
		if got := md["domain"].GetStringValue() == "q" && md["metadata"].GetStructValue().GetFields()["backend"].GetStringValue() == "b"; got != c.meta {
			t.Errorf("%v: dynamic metadata %v", c.flags, resp.GetDynamicMetadata())
		}
	}
}

// --quota-group-keys reaches the answers too: two quota buckets of one
// group, one spent, make the request over with the flag (and no metadata
// of the group's passing bucket), and leave it passing without it.
func TestServeQuotaGroupKeys(t *testing.T) {
	dir := t.TempDir()
	rules := "domain: q\ndescriptors:\n  - key: g\n    descriptors:\n" +
		"      - key: a\n        quota_mode: true\n        rate_limit: {unit: hour, requests_per_unit: 0}\n" +
		"      - key: b\n        quota_mode: true\n        rate_limit: {unit: hour, requests_per_unit: 5}\n        metadata: {backend: b}\n"
	if err := os.WriteFile(filepath.Join(dir, "q.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	local := []string{"--config-dir", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", "",
		"--response-dynamic-metadata"}
	entries := func(kv ...string) *rlv3.RateLimitDescriptor {
		d := &rlv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		return d
	}
	req := &rlsv3.RateLimitRequest{Domain: "q", Descriptors: []*rlv3.RateLimitDescriptor{
		entries("g", "1", "a", "x"), entries("g", "1", "b", "y")}}
	for _, c := range []struct {
		flags []string
		want  rlsv3.RateLimitResponse_Code
		meta  bool
	}{
		{nil, rlsv3.RateLimitResponse_OK, true},
		{[]string{"--quota-group-keys", "g"}, rlsv3.RateLimitResponse_OVER_LIMIT, false},
	} {
		p := startServeProcess(t, append(local, c.flags...)...)
		resp, err := send(dial(t, p.addrs["grpc"]), req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != c.want || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[1].Code != rlsv3.RateLimitResponse_OK {
			t.Errorf("%v: %v", c.flags, resp)
		}
		if got := resp.GetDynamicMetadata().GetFields()["metadata"] != nil; got != c.meta {
			t.Errorf("%v: dynamic metadata %v", c.flags, resp.GetDynamicMetadata())
		}
	}
}
