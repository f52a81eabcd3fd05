package descriptors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice/filewatch"
)

// Timings of a Watcher. Events come in bursts (an editor writes a temporary
// file and renames it; a ConfigMap update creates a directory and two
// symlinks), so a reload waits for the burst to settle. Polling is the
// safety net for events that never arrive, as on network file systems
// (filewatch itself follows a directory removed and created again).
const (
	debounceDelay = 150 * time.Millisecond
	pollInterval  = 5 * time.Second
)

// ReloadStats counts the reloads of a Watcher. A reload that finds the
// files unchanged is not counted.
type ReloadStats struct {
	OK, Failed uint64 // the load done by Watch counts as one OK
	// LastError is the error of the last attempt when it failed; it is
	// cleared once the directory holds a valid config again.
	LastError   string
	LastOK      time.Time
	LastAttempt time.Time
}

// Watcher keeps the current Config of a directory up to date.
type Watcher struct {
	dir  string
	log  *slog.Logger
	cur  atomic.Pointer[Config]
	done chan struct{} // closed when the watch loop has stopped
	// watching is closed once the file watches are in place and the
	// directory has been re-read under them: tests wait for it, so that
	// what they do to the directory does not race that first re-read.
	watching chan struct{}

	mu       sync.Mutex // serialises reloads
	failedAt string     // fingerprint and error of the last failure, to count each failure once

	statsMu sync.Mutex
	stats   ReloadStats
}

type watchOptions struct {
	debounce time.Duration
	poll     time.Duration
	notify   bool // use file events; off only in tests of the polling fallback
}

// Watch loads dir and keeps the result up to date until ctx is done: on
// file events (debounced) and, as a safety net, by polling the content
// fingerprint every few seconds. It returns an error if the initial load
// fails; an empty directory loads (and limits nothing). A later load that
// fails, or that finds no rule file, keeps the previous Config in force; it
// is logged at error level and counted in Stats. A nil log discards logs.
func Watch(ctx context.Context, dir string, log *slog.Logger) (*Watcher, error) {
	return watch(ctx, dir, log, watchOptions{debounce: debounceDelay, poll: pollInterval, notify: true})
}

func watch(ctx context.Context, dir string, log *slog.Logger, opts watchOptions) (*Watcher, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg, err := Load(dir)
	if err != nil {
		return nil, fmt.Errorf("load mapping config from %s: %w", dir, err)
	}
	w := &Watcher{dir: dir, log: log.With("dir", dir), done: make(chan struct{}), watching: make(chan struct{})}
	w.cur.Store(cfg)
	now := time.Now()
	w.stats = ReloadStats{OK: 1, LastOK: now, LastAttempt: now}
	w.logLoaded(cfg)

	go func() {
		defer close(w.done)
		first := true
		filewatch.Run(ctx, filewatch.Options{Dirs: []string{dir}, Debounce: opts.debounce, Interval: opts.poll,
			NoEvents: !opts.notify, What: "config dir", Log: log}, func() {
			_ = w.Reload() // logged and counted by Reload
			if first {
				first = false
				close(w.watching)
			}
		})
	}()
	return w, nil
}

// Current returns the Config in force. It is never nil.
func (w *Watcher) Current() *Config { return w.cur.Load() }

// Stats returns a snapshot of the reload counters.
func (w *Watcher) Stats() ReloadStats {
	w.statsMu.Lock()
	defer w.statsMu.Unlock()
	return w.stats
}

// Reload reloads the directory now, by the same rules as an automatic
// reload: unchanged content is a no-op, a failure keeps the current Config
// and is returned (and counted once per distinct failure).
func (w *Watcher) Reload() error {
	w.mu.Lock()
	defer w.mu.Unlock()

	cur := w.cur.Load()
	files, err := readDir(w.dir)
	fp := ""
	if err == nil {
		fp = fingerprint(files)
		if fp == cur.Fingerprint() {
			w.recovered() // e.g. a broken edit was reverted
			return nil
		}
		var cfg *Config
		if len(files) == 0 {
			err = errNoRuleFiles
		} else if cfg, err = parse(files, fp); err == nil {
			w.cur.Store(cfg)
			w.recordOK()
			w.logLoaded(cfg)
			return nil
		}
	}
	// A broken directory stays broken until someone edits it; polling must
	// not count and log the same failure every few seconds.
	key := fp + "\x00" + err.Error()
	if key == w.failedAt {
		return err
	}
	w.failedAt = key
	w.recordFailure(err)
	w.log.Error("mapping config reload failed, keeping the previous config", "error", err,
		"in_force", cur.fingerprint[:12])
	return err
}

// errNoRuleFiles refuses a reload that would leave no rule file. An empty
// directory is what a half-done replacement looks like (rm -rf and copy, a
// volume being remounted, "rm *.yaml" before the new files): applying it
// would drop every limit at once. Start-up may still load an empty
// directory, and a file holding only a domain limits nothing on purpose.
var errNoRuleFiles = errors.New("no rule files (*.yaml, *.yml) in the directory; a reload never drops every rule " +
	"(to limit nothing, leave a file with only a domain)")

func (w *Watcher) logLoaded(cfg *Config) {
	w.log.Info("mapping config loaded", "domains", len(cfg.domainNames), "rules", len(cfg.rules),
		"fingerprint", cfg.fingerprint[:12])
}

func (w *Watcher) recordOK() {
	w.failedAt = ""
	now := time.Now()
	w.statsMu.Lock()
	defer w.statsMu.Unlock()
	w.stats.OK++
	w.stats.LastOK, w.stats.LastAttempt = now, now
	w.stats.LastError = ""
}

func (w *Watcher) recovered() {
	if w.failedAt == "" {
		return
	}
	w.failedAt = ""
	w.log.Info("mapping config directory is back to the rules in force", "fingerprint", w.cur.Load().fingerprint[:12])
	w.statsMu.Lock()
	defer w.statsMu.Unlock()
	w.stats.LastError = ""
}

func (w *Watcher) recordFailure(err error) {
	w.statsMu.Lock()
	defer w.statsMu.Unlock()
	w.stats.Failed++
	w.stats.LastAttempt = time.Now()
	w.stats.LastError = err.Error()
}
