package ratelimit_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rl/sluice/ratelimit"
)

// recorder is an Observer that keeps what it hears as text.
type recorder struct {
	mu       sync.Mutex
	decided  []string
	answered []string
	failures []string
}

func (r *recorder) Decided(_ context.Context, d ratelimit.Decided) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rule := "-"
	if d.Rule != nil {
		rule = d.Rule.Path
	}
	r.decided = append(r.decided, fmt.Sprintf("%s %s %s %s", d.Domain, rule, d.Entity, d.Outcome))
}

func (r *recorder) Answered(_ context.Context, a ratelimit.Answered) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if a.Duration <= 0 {
		r.answered = append(r.answered, "no duration")
	}
	r.answered = append(r.answered, fmt.Sprintf("%s known=%v %s %s", a.Domain, a.KnownDomain, a.Code, a.Overall))
}

func (r *recorder) FailurePolicyApplied(_ context.Context, domain string, p ratelimit.FailurePolicy, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, fmt.Sprintf("%s %s %v", domain, p, err))
}

func (r *recorder) take() (decided, answered []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	decided, answered = r.decided, r.answered
	r.decided, r.answered = nil, nil
	return decided, answered
}

func TestObserverHearsEveryOutcome(t *testing.T) {
	rec := &recorder{}
	c, _ := newService(t, ratelimit.Options{Observer: rec, NearLimitRatio: 0.5})
	one := func(kv ...string) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc(kv...)}}
	}
	// per_ip allows 3 a minute: 2 left is ok, 1 left is past half used,
	// then over.
	for range 4 {
		call(t, c, one("ip", "10.0.0.1"))
	}
	call(t, c, one("unl", "x"))
	call(t, c, one("nomatch", "x"))
	call(t, c, one("shadow", "s"))
	call(t, c, one("shadow", "s"))
	call(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("a", "x"), desc("b", "y")}})
	decided, answered := rec.take()
	want := []string{
		"test test/ip 10.0.0.1 ok",
		"test test/ip 10.0.0.1 near_limit",
		"test test/ip 10.0.0.1 near_limit",
		"test test/ip 10.0.0.1 over_limit",
		"test test/unl x unlimited",
		"test -  unmatched",
		"test test/shadow s near_limit", // a burst of 1: none left
		"test test/shadow s shadow_over_limit",
		"test test/a=x _global_ replaced", // (b=y)'s rule replaces it
		"test test/b=y _global_ ok",
	}
	if !slices.Equal(decided, want) {
		t.Errorf("decided\n%s\nwant\n%s", strings.Join(decided, "\n"), strings.Join(want, "\n"))
	}
	if len(answered) != 9 || answered[3] != "test known=true OK OVER_LIMIT" || answered[0] != "test known=true OK OK" {
		t.Errorf("answered %q", answered)
	}

	// Refused requests are answered too, and an unknown domain says so.
	if _, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "nope", Descriptors: []*rlv3.RateLimitDescriptor{desc("k", "v")}}); err != nil {
		t.Fatal(err)
	}
	c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test"})
	_, answered = rec.take()
	if want := []string{"nope known=false OK OK", "test known=true InvalidArgument UNKNOWN"}; !slices.Equal(answered, want) {
		t.Errorf("answered %q, want %q", answered, want)
	}
}

// A backend failing every call logs one warning per interval, with the
// number held back and the kind of failure, never the error's text (it
// may quote request values).
func TestFailureLogIsRateLimited(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelInfo}))
	rec := &recorder{}
	svc := ratelimit.New(rules(t, testRules), failing{}, ratelimit.Options{
		OnBackendError: ratelimit.FailAllow, Logger: log, Observer: rec, FailureLogInterval: 200 * time.Millisecond,
	})
	req := &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*rlv3.RateLimitDescriptor{desc("ip", "secret-value")}}
	for range 100 {
		if _, err := svc.ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(250 * time.Millisecond)
	if _, err := svc.ShouldRateLimit(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "not_logged_since_last=0") || !strings.Contains(lines[1], "not_logged_since_last=99") ||
		!strings.Contains(lines[0], "kind=error") || !strings.Contains(lines[0], "policy=allow") {
		t.Errorf("log:\n%s", out)
	}
	if strings.Contains(out, "secret-value") || strings.Contains(out, "connection refused") {
		t.Errorf("request values or error text at info level:\n%s", out)
	}
	if len(rec.failures) != 101 || rec.failures[0] != "test allow connection refused" {
		t.Errorf("observer heard %d failures (%q)", len(rec.failures), rec.failures[:1])
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
