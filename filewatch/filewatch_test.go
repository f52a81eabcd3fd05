package filewatch

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// waitFor polls cond for up to 3 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func start(t *testing.T, o Options) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, o, func() { n.Add(1) })
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	waitFor(t, "the first reload", func() bool { return n.Load() == 1 })
	return &n
}

// A burst of writes is one reload once it settles; nothing happens while
// nothing changes.
func TestEventsAreDebounced(t *testing.T) {
	dir := t.TempDir()
	n := start(t, Options{Dirs: []string{dir}, Debounce: 100 * time.Millisecond, Interval: time.Hour})
	for i := range 5 {
		if err := os.WriteFile(filepath.Join(dir, "f"+strconv.Itoa(i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "a reload after the writes", func() bool { return n.Load() >= 2 })
	time.Sleep(300 * time.Millisecond)
	if got := n.Load(); got != 2 {
		t.Fatalf("%d reloads for one burst of writes, want 2 (the first and one after the burst)", got)
	}
}

// Without events, the period still reloads. (A directory removed and
// created again is covered through descriptors' watcher tests.)
func TestPeriodWithoutEvents(t *testing.T) {
	dir := t.TempDir()
	n := start(t, Options{Dirs: []string{dir}, Debounce: 20 * time.Millisecond, Interval: 100 * time.Millisecond, NoEvents: true})
	waitFor(t, "periodic reloads", func() bool { return n.Load() >= 3 })
}
