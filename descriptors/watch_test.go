package descriptors

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a log sink safe for the watcher goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func domainFile(domain string, rpu int) string {
	return "domain: " + domain + "\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: " + strconv.Itoa(rpu) + "}\n"
}

// rpuOf returns the requests per unit that the watcher's current config
// gives descriptor k=v of domain, or -1 when nothing matches.
func rpuOf(w *Watcher, domain string) int64 {
	m, ok := w.Current().Match(domain, desc("k", "v"))
	if !ok || len(m.Rule.Limits) == 0 {
		return -1
	}
	return m.Rule.Limits[0].Amount / 1000
}

// startWatch starts a watcher on dir that stops with the test.
func startWatch(t *testing.T, dir string, opts watchOptions) (*Watcher, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	w, err := watch(ctx, dir, slog.New(slog.NewTextHandler(logs, nil)), opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		select {
		case <-w.done:
		case <-time.After(2 * time.Second):
			t.Error("watcher did not stop after its context was cancelled")
		}
	})
	select {
	case <-w.watching:
	case <-time.After(2 * time.Second):
		t.Fatal("the watches were not in place after 2 s")
	}
	return w, logs
}

// defaultOpts are Watch's own settings: a change must be seen through file
// events, long before the 5 s poll.
var defaultOpts = watchOptions{debounce: debounceDelay, poll: pollInterval, notify: true}

func TestWatchEditBreakFix(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "x.yaml", domainFile("x", 1))
	w, logs := startWatch(t, dir, defaultOpts)
	if got := rpuOf(w, "x"); got != 1 {
		t.Fatalf("initial rate %d, want 1", got)
	}
	if s := w.Stats(); s.OK != 1 || s.Failed != 0 || s.LastOK.IsZero() {
		t.Errorf("initial stats %+v, want OK 1", s)
	}

	// Edit: seen within a couple of seconds.
	writeFile(t, dir, "x.yaml", domainFile("x", 2))
	eventually(t, 2*time.Second, "the edit", func() bool { return rpuOf(w, "x") == 2 })
	eventually(t, time.Second, "OK count 2", func() bool { return w.Stats().OK == 2 })
	if !strings.Contains(logs.String(), "mapping config loaded") || !strings.Contains(logs.String(), "rules=1") {
		t.Errorf("no info line with the rule count in the logs:\n%s", logs)
	}

	// Break it: the previous config stays in force.
	before := w.Current()
	writeFile(t, dir, "x.yaml", "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n")
	eventually(t, 2*time.Second, "the failure", func() bool { return w.Stats().Failed == 1 })
	s := w.Stats()
	if !strings.Contains(s.LastError, "x.yaml:4: ") || !strings.Contains(s.LastError, "fortnight") {
		t.Errorf("LastError %q, want it to name x.yaml:4 and the bad unit", s.LastError)
	}
	if w.Current() != before || rpuOf(w, "x") != 2 {
		t.Error("a failed reload replaced the config")
	}
	if !strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("failure not logged at error level:\n%s", logs)
	}
	// The same failure is counted once, however often it is retried.
	if err := w.Reload(); err == nil {
		t.Error("Reload of a broken directory returned nil")
	}
	if got := w.Stats().Failed; got != 1 {
		t.Errorf("Failed = %d after a retry of the same failure, want 1", got)
	}

	// Fix it: recovers.
	writeFile(t, dir, "x.yaml", domainFile("x", 3))
	eventually(t, 2*time.Second, "the fix", func() bool { return rpuOf(w, "x") == 3 })
	eventually(t, time.Second, "OK count 3", func() bool { return w.Stats().OK == 3 })
	if s := w.Stats(); s.LastError != "" || s.Failed != 1 || s.LastOK.Before(s.LastAttempt) {
		t.Errorf("stats after recovery %+v", s)
	}
}

func TestWatchUnchangedIsNoop(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "x.yaml", domainFile("x", 1))
	w, _ := startWatch(t, dir, defaultOpts)
	cfg := w.Current()
	writeFile(t, dir, "x.yaml", domainFile("x", 1)) // same bytes, new file
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * debounceDelay) // let the event-driven reload run too
	if s := w.Stats(); s.OK != 1 || s.Failed != 0 {
		t.Errorf("stats %+v after rewriting the same content, want OK 1", s)
	}
	if w.Current() != cfg {
		t.Error("config swapped although the content did not change")
	}
}

// TestWatchConfigMapSwap updates the directory the way the kubelet updates a
// ConfigMap volume: a new timestamped directory, a "..data_tmp" symlink to
// it, renamed over "..data".
func TestWatchConfigMapSwap(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mkdirFile := func(sub, content string) {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, sub), "x.yaml", content)
	}
	mkdirFile("..2026_01_01_00_00_00.000000001", domainFile("x", 1))
	mustSymlink(t, "..2026_01_01_00_00_00.000000001", filepath.Join(dir, "..data"))
	mustSymlink(t, "..data/x.yaml", filepath.Join(dir, "x.yaml"))

	w, _ := startWatch(t, dir, defaultOpts)
	if got := rpuOf(w, "x"); got != 1 {
		t.Fatalf("initial rate %d, want 1", got)
	}

	mkdirFile("..2026_01_01_00_05_00.000000002", domainFile("x", 2))
	mustSymlink(t, "..2026_01_01_00_05_00.000000002", filepath.Join(dir, "..data_tmp"))
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..2026_01_01_00_00_00.000000001")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "the swapped config", func() bool { return rpuOf(w, "x") == 2 })
	if s := w.Stats(); s.Failed != 0 || s.OK != 2 {
		t.Errorf("stats %+v, want OK 2 and no failure", s)
	}
}

func TestWatchDirectoryRemoved(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "config")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "x.yaml", domainFile("x", 1))
	// No poll within the test: the removal and the return can only be
	// seen through the parent directory's events.
	opts := defaultOpts
	opts.poll = time.Hour
	w, _ := startWatch(t, dir, opts)
	cfg := w.Current()

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "the failed reload", func() bool { return w.Stats().Failed >= 1 })
	if w.Current() != cfg || rpuOf(w, "x") != 1 {
		t.Error("the previous config was dropped when the directory went away")
	}
	if s := w.Stats(); !strings.Contains(s.LastError, "no such file or directory") {
		t.Errorf("LastError %q", s.LastError)
	}
	for range 3 { // retries of the same failure, as the poll makes them
		if err := w.Reload(); err == nil {
			t.Fatal("Reload of a missing directory returned nil")
		}
	}
	if got := w.Stats().Failed; got != 1 {
		t.Errorf("Failed = %d, want the missing directory counted once", got)
	}

	// It comes back empty first: still the previous rules, a new failure.
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "the empty directory refused", func() bool { return w.Stats().Failed == 2 })
	if s := w.Stats(); !strings.Contains(s.LastError, "no rule files") || rpuOf(w, "x") != 1 {
		t.Errorf("after an empty directory came back: LastError %q, rate %d", s.LastError, rpuOf(w, "x"))
	}

	// Then a rule file: the watcher picks it up, and sees later edits.
	writeFile(t, dir, "x.yaml", domainFile("x", 5))
	eventually(t, 2*time.Second, "the recreated directory", func() bool { return rpuOf(w, "x") == 5 })
	writeFile(t, dir, "x.yaml", domainFile("x", 6))
	eventually(t, 2*time.Second, "an edit in the recreated directory", func() bool { return rpuOf(w, "x") == 6 })
}

// Without file events, the poll alone must find the change.
func TestWatchPollingFallback(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "x.yaml", domainFile("x", 1))
	w, _ := startWatch(t, dir, watchOptions{debounce: debounceDelay, poll: 100 * time.Millisecond, notify: false})
	writeFile(t, dir, "x.yaml", domainFile("x", 2))
	eventually(t, 2*time.Second, "the polled change", func() bool { return rpuOf(w, "x") == 2 })
}

func TestWatchInitialLoadFails(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "x.yaml", "domain: \"\"\n")
	if _, err := Watch(context.Background(), dir, nil); err == nil || !strings.Contains(err.Error(), "x.yaml:1: file has an empty domain") {
		t.Errorf("Watch error = %v, want x.yaml:1: file has an empty domain", err)
	}
	if _, err := Watch(context.Background(), filepath.Join(dir, "missing"), nil); err == nil {
		t.Error("Watch of a missing directory succeeded")
	}
}

// Current may be read while reloads swap it (run with -race).
func TestWatchConcurrentReads(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "x.yaml", domainFile("x", 1))
	w, _ := startWatch(t, dir, defaultOpts)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					if rpuOf(w, "x") < 1 {
						t.Error("no limit while reloading")
						return
					}
					_ = w.Stats()
				}
			}
		})
	}
	for i := 2; i < 6; i++ {
		writeFile(t, dir, "x.yaml", domainFile("x", i))
		if err := w.Reload(); err != nil {
			t.Error(err)
		}
	}
	close(stop)
	wg.Wait()
	if got := rpuOf(w, "x"); got != 5 {
		t.Errorf("final rate %d, want 5", got)
	}
}

// A reload never applies a directory left without rule files: emptying it
// is what a half-done replacement looks like. A file with only a domain
// turns every rule off on purpose. Reverting to the rules in force is
// logged as a recovery.
func TestWatchEmptiedDirectoryKeepsRules(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "x.yaml", domainFile("x", 1))
	writeFile(t, dir, "y.yaml", domainFile("y", 2))
	w, logs := startWatch(t, dir, defaultOpts)

	// Removing one file is an edit like any other.
	if err := os.Remove(filepath.Join(dir, "y.yaml")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "y dropped", func() bool { return !w.Current().HasDomain("y") })
	cfg := w.Current()

	// Removing the last one is refused.
	if err := os.Remove(filepath.Join(dir, "x.yaml")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "the failure", func() bool { return w.Stats().Failed == 1 })
	if w.Current() != cfg || rpuOf(w, "x") != 1 {
		t.Error("an emptied directory dropped the rules")
	}
	if s := w.Stats(); !strings.Contains(s.LastError, "no rule files") {
		t.Errorf("LastError %q, want it to say there are no rule files", s.LastError)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "no rule files") {
		t.Errorf("the refusal is not logged at error level:\n%s", logs)
	}

	// The same file back: no reload to count, but the failure is over.
	writeFile(t, dir, "x.yaml", domainFile("x", 1))
	eventually(t, 2*time.Second, "the recovery", func() bool { return w.Stats().LastError == "" })
	if s := w.Stats(); s.OK != 2 || s.Failed != 1 || w.Current() != cfg {
		t.Errorf("stats %+v after restoring the file in force, want OK 2, Failed 1, the same config", s)
	}
	if !strings.Contains(logs.String(), "back to the rules in force") {
		t.Errorf("the recovery is not logged:\n%s", logs)
	}

	// A domain without descriptors: every rule off, deliberately.
	writeFile(t, dir, "x.yaml", "domain: x\n")
	eventually(t, 2*time.Second, "the rules turned off", func() bool { return rpuOf(w, "x") == -1 })
	if s := w.Stats(); s.Failed != 1 || s.LastError != "" {
		t.Errorf("stats %+v after a valid file without rules", s)
	}
}

// An empty directory may be served from the start (it limits nothing);
// once rules are loaded, emptying it again is refused.
func TestWatchStartsOnEmptyDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	w, _ := startWatch(t, dir, defaultOpts)
	if got := len(w.Current().Domains()); got != 0 {
		t.Fatalf("%d domains in an empty directory", got)
	}
	if err := w.Reload(); err != nil {
		t.Errorf("Reload of the same empty directory: %v", err)
	}
	writeFile(t, dir, "x.yaml", domainFile("x", 1))
	eventually(t, 2*time.Second, "the first rules", func() bool { return rpuOf(w, "x") == 1 })
	if err := os.Remove(filepath.Join(dir, "x.yaml")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "the refusal", func() bool { return w.Stats().Failed == 1 })
	if rpuOf(w, "x") != 1 {
		t.Error("the rules were dropped")
	}
}

// A file truncated in place by a writer that has not written yet (a
// shell's "> x.yaml", a plain os.WriteFile) is not "no rules": the reload
// fails and the previous rules stay until the content arrives.
func TestWatchTruncatedFileKeepsRules(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "x.yaml", domainFile("x", 1))
	w, _ := startWatch(t, dir, defaultOpts)
	path := filepath.Join(dir, "x.yaml")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	eventually(t, 2*time.Second, "the failure", func() bool { return w.Stats().Failed == 1 })
	if s := w.Stats(); !strings.Contains(s.LastError, "x.yaml:1: empty file") || rpuOf(w, "x") != 1 {
		t.Errorf("after truncation: LastError %q, rate %d; want x.yaml:1: empty file and rate 1", s.LastError, rpuOf(w, "x"))
	}
	// Half the content: still invalid, still the previous rules.
	half := domainFile("x", 7)
	if _, err := f.WriteString(half[:len(half)-20]); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "the second failure", func() bool { return w.Stats().Failed == 2 })
	if rpuOf(w, "x") != 1 {
		t.Error("a half-written file replaced the rules")
	}
	if _, err := f.WriteString(half[len(half)-20:]); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "the complete file", func() bool { return rpuOf(w, "x") == 7 })
}
