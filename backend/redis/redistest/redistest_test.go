package redistest

import (
	"context"
	"strings"
	"testing"
	"time"
)

// The harness gives a server that answers, with the configuration asked
// for; Kill refuses connections until Restart brings it back empty; Pause
// leaves connections hanging until Resume.
func TestServerFaults(t *testing.T) {
	srv := RequireWith(t, Options{Config: []string{"maxmemory", "2mb", "maxmemory-policy", "noeviction"}})
	ctx := t.Context()
	if got, err := srv.Do(ctx, "INFO", "memory"); err != nil || !strings.Contains(got, "maxmemory:2097152") || !strings.Contains(got, "maxmemory_policy:noeviction") {
		t.Fatalf("INFO memory does not show the configuration asked for: %v\n%s", err, got)
	}
	if _, err := srv.Do(ctx, "SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	if err := srv.Ping(ctx); err == nil {
		t.Fatal("a killed server answered")
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := srv.Do(ctx, "EXISTS", "k"); err != nil || got != "0" {
		t.Errorf("after a restart EXISTS k = %q %v, want 0: the server keeps nothing", got, err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := srv.Ping(short); err == nil {
		t.Error("a paused server answered")
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Ping(ctx); err != nil {
		t.Errorf("after Resume: %v", err)
	}
}
