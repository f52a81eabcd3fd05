package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// overLimit builds, for each input limit flag, a request carrying n of
// what the limit counts; n is one past the limit in force in the tests.
var overLimit = []struct {
	flag string
	req  func(n int) *rlsv3.RateLimitRequest
}{
	{"--max-descriptors", func(n int) *rlsv3.RateLimitRequest {
		r := &rlsv3.RateLimitRequest{Domain: "edge"}
		for i := range n {
			r.Descriptors = append(r.Descriptors, entries("remote_address", fmt.Sprint("10.7.0.", i)))
		}
		return r
	}},
	{"--max-entries", func(n int) *rlsv3.RateLimitRequest {
		var kv []string
		for i := range n {
			kv = append(kv, fmt.Sprint("k", i), "v")
		}
		return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{entries(kv...)}}
	}},
	{"--max-key-bytes", func(n int) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{entries(strings.Repeat("k", n), "v")}}
	}},
	{"--max-value-bytes", func(n int) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{entries("remote_address", strings.Repeat("v", n))}}
	}},
}

func entries(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// Over real gRPC: a request one past an input limit is refused with
// INVALID_ARGUMENT naming the limit the way its flag does, and the server
// keeps answering; raising the flag admits that request; a flag of zero or
// less is a usage error naming it.
func TestServeInputLimitFlags(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(rulesV1), 0o644); err != nil {
		t.Fatal(err)
	}
	defaults := map[string]int{"--max-descriptors": 64, "--max-entries": 32, "--max-key-bytes": 256, "--max-value-bytes": 4096}
	ctx := context.Background()
	local := []string{"--config-dir", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", ""}

	c := dial(t, serveCommandLine(t, local...)["grpc"])
	for i, o := range overLimit {
		n := defaults[o.flag] + 1
		_, err := c.ShouldRateLimit(ctx, o.req(n))
		msg := status.Convert(err).Message()
		wantName := strings.TrimPrefix(o.flag, "--")
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(msg, fmt.Sprintf("over the limit of %d (%s)", n-1, wantName)) {
			t.Errorf("%s: %d past the default: %v; want INVALID_ARGUMENT naming %s and %d", o.flag, n, err, wantName, n-1)
		}
		// The refusal costs the server nothing: the next call is decided.
		resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
			Descriptors: []*rlv3.RateLimitDescriptor{entries("remote_address", fmt.Sprint("10.8.0.", i))}})
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("a valid call after the %s refusal: %v %v", o.flag, resp, err)
		}
	}

	raised := dial(t, serveCommandLine(t, append(slices.Clone(local), "--max-descriptors", "65", "--max-entries", "33",
		"--max-key-bytes", "257", "--max-value-bytes", "4097")...)["grpc"])
	for _, o := range overLimit {
		n := defaults[o.flag] + 1
		resp, err := raised.ShouldRateLimit(ctx, o.req(n))
		if err != nil || len(resp.Statuses) != len(o.req(n).Descriptors) {
			t.Errorf("%s %d: a request of %d refused: %v %v", o.flag, n, n, resp, err)
		}
		_, err = raised.ShouldRateLimit(ctx, o.req(n+1))
		if want := fmt.Sprintf("over the limit of %d (%s)", n, strings.TrimPrefix(o.flag, "--")); status.Code(err) != codes.InvalidArgument ||
			!strings.Contains(status.Convert(err).Message(), want) {
			t.Errorf("%s %d: a request of %d: %v; want INVALID_ARGUMENT with %q", o.flag, n, n+1, err, want)
		}
	}

	// A serve that wrongly accepted the flag would serve until sluice's
	// timeout, then exit 0.
	serve := append([]string{"serve"}, local...)
	for _, o := range overLimit {
		for _, v := range []string{"0", "-1"} {
			if out, code := sluice(t, append(slices.Clone(serve), o.flag, v)...); code != 2 || !strings.Contains(out, o.flag+" "+v) {
				t.Errorf("serve %s %s: exit %d, want 2 naming the flag:\n%s", o.flag, v, code, out)
			}
		}
	}
	t.Setenv("SLUICE_MAX_ENTRIES", "0")
	if out, code := sluice(t, serve...); code != 2 || !strings.Contains(out, "--max-entries 0") {
		t.Errorf("SLUICE_MAX_ENTRIES=0: exit %d, want 2 naming --max-entries:\n%s", code, out)
	}
}
