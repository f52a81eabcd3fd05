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

// reloadAfter does a change and waits for the reload it causes.
func reloadAfter(t *testing.T, n *atomic.Int64, what string, do func()) {
	t.Helper()
	before := n.Load()
	do()
	waitFor(t, "a reload after "+what, func() bool { return n.Load() > before })
}

// noReloadAfter checks that do causes no reload within a few debounces.
func noReloadAfter(t *testing.T, n *atomic.Int64, what string, do func()) {
	t.Helper()
	time.Sleep(100 * time.Millisecond) // let earlier events settle
	before := n.Load()
	do()
	time.Sleep(300 * time.Millisecond)
	if got := n.Load(); got != before {
		t.Errorf("%d reloads after %s, want none", got-before, what)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, path string) {
	t.Helper()
	must(t, os.WriteFile(path, []byte("x"), 0o644))
}

// A directory removed and created again is seen through its parent's
// events, and its own events are watched again at once: no wait for the
// period (an hour here).
func TestDirectoryRecreatedIsSeenByEvents(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "config")
	must(t, os.Mkdir(dir, 0o755))
	n := start(t, Options{Dirs: []string{dir}, Debounce: 20 * time.Millisecond, Interval: time.Hour})

	reloadAfter(t, n, "the removal", func() { must(t, os.RemoveAll(dir)) })
	reloadAfter(t, n, "the directory came back", func() { must(t, os.Mkdir(dir, 0o755)) })
	reloadAfter(t, n, "a write in the new directory", func() { write(t, filepath.Join(dir, "x.yaml")) })
	noReloadAfter(t, n, "a write beside the directory", func() { write(t, filepath.Join(parent, "other")) })
}

// A directory renamed away and replaced by another: the watch follows the
// path, not the directory that went away.
func TestDirectoryReplacedByRename(t *testing.T) {
	parent := t.TempDir()
	dir, old, next := filepath.Join(parent, "config"), filepath.Join(parent, "config.old"), filepath.Join(parent, "config.next")
	must(t, os.Mkdir(dir, 0o755))
	must(t, os.Mkdir(next, 0o755))
	n := start(t, Options{Dirs: []string{dir}, Debounce: 20 * time.Millisecond, Interval: time.Hour})

	reloadAfter(t, n, "the swap", func() {
		must(t, os.Rename(dir, old))
		must(t, os.Rename(next, dir))
	})
	reloadAfter(t, n, "a write in the new directory", func() { write(t, filepath.Join(dir, "x.yaml")) })
	noReloadAfter(t, n, "a write in the directory renamed away", func() { write(t, filepath.Join(old, "x.yaml")) })
}

// A directory given as a symlink that is swapped to another target (a
// release switch): the watch moves to the new target.
func TestSymlinkedDirectorySwapped(t *testing.T) {
	parent := t.TempDir()
	v1, v2, cur := filepath.Join(parent, "v1"), filepath.Join(parent, "v2"), filepath.Join(parent, "current")
	must(t, os.Mkdir(v1, 0o755))
	must(t, os.Mkdir(v2, 0o755))
	must(t, os.Symlink("v1", cur))
	n := start(t, Options{Dirs: []string{cur}, Debounce: 20 * time.Millisecond, Interval: time.Hour})

	reloadAfter(t, n, "the symlink swap", func() {
		must(t, os.Symlink("v2", cur+".tmp"))
		must(t, os.Rename(cur+".tmp", cur))
	})
	reloadAfter(t, n, "a write in the new target", func() { write(t, filepath.Join(v2, "x.yaml")) })
	noReloadAfter(t, n, "a write in the old target", func() { write(t, filepath.Join(v1, "x.yaml")) })
}
