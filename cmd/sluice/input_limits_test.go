package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// runServe runs `sluice serve` with args, as the binary would (flags,
// environment, validation), on loopback ports of its own, and returns a
// client of its gRPC port once it logs that it serves. The server stops
// when the test ends, and must exit cleanly.
func runServe(t *testing.T, args ...string) rlsv3.RateLimitServiceClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	done := make(chan int, 1)
	args = append([]string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", ""}, args...)
	go func() { done <- run(ctx, args, io.Discard, logs) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("sluice serve exited %d:\n%s", code, logs)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("sluice serve did not stop:\n%s", logs)
		}
	})
	addr := regexp.MustCompile(`grpc=(\S+)`)
	var m []string
	for deadline := time.Now().Add(30 * time.Second); m == nil; m = addr.FindStringSubmatch(logs.String()) {
		select {
		case code := <-done:
			done <- code // for the cleanup
			t.Fatalf("sluice %s exited %d before serving:\n%s", strings.Join(args, " "), code, logs)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("sluice serve not serving after 30 s:\n%s", logs)
		}
	}
	return dial(t, m[1])
}

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

	c := runServe(t, "--config-dir", dir)
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

	raised := runServe(t, "--config-dir", dir, "--max-descriptors", "65", "--max-entries", "33",
		"--max-key-bytes", "257", "--max-value-bytes", "4097")
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

	// A serve that wrongly accepted the flag would run until the timeout,
	// then exit 0.
	refused := func(args ...string) (string, int) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var out bytes.Buffer
		args = append([]string{"serve", "--config-dir", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", ""}, args...)
		code := run(ctx, args, &out, &out)
		return out.String(), code
	}
	for _, o := range overLimit {
		for _, v := range []string{"0", "-1"} {
			if out, code := refused(o.flag, v); code != 2 || !strings.Contains(out, o.flag+" "+v) {
				t.Errorf("serve %s %s: exit %d, want 2 naming the flag:\n%s", o.flag, v, code, out)
			}
		}
	}
	t.Setenv("SLUICE_MAX_ENTRIES", "0")
	if out, code := refused(); code != 2 || !strings.Contains(out, "--max-entries 0") {
		t.Errorf("SLUICE_MAX_ENTRIES=0: exit %d, want 2 naming --max-entries:\n%s", code, out)
	}
}
