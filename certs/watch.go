package certs

import (
	"context"
	"path/filepath"
	"slices"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultInterval is the period of the content check of Watch when it is
// given none. Rotations usually happen well ahead of expiry, so a few
// seconds of delay when file events are missed cost nothing.
const DefaultInterval = 10 * time.Second

// debounceDelay lets a burst of events settle before reloading: a Secret
// volume update creates a directory, a symlink and renames it; a tool may
// write the certificate and the key one after the other. Reloading between
// the two would count a spurious mismatch.
const debounceDelay = 100 * time.Millisecond

// Watch reloads the files when they change, until ctx is done; it blocks,
// so run it in a goroutine and wait for it to return to stop it cleanly.
//
// Change detection has two layers. File events on the directories of the
// files (not the files: a renamed-over file or a swapped "..data" symlink
// is an event in the directory, and a watch on the old file would go with
// it) trigger a reload after a short debounce. Every interval
// (DefaultInterval when interval <= 0) the contents are compared with those
// in force anyway, for the changes events miss: a file that is a symlink
// into another directory, a directory removed and created again, network
// file systems. Unchanged contents cost a read and a hash.
//
// Watch re-reads the files once its watches are in place, so a change made
// between New and Watch is not missed.
func (r *Reloader) Watch(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultInterval
	}
	dirs := r.dirs()
	var (
		events <-chan fsnotify.Event
		errs   <-chan error
	)
	// Without file events the periodic check still reloads, only later: a
	// watch that cannot start is worth a warning, not a refusal to serve.
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		r.log.Warn("file events unavailable, checking certificate files periodically only",
			"error", err, "interval", interval)
	} else {
		defer fw.Close()
		events, errs = fw.Events, fw.Errors
		for _, d := range dirs {
			if err := fw.Add(d); err != nil {
				r.log.Warn("cannot watch certificate dir, checking it periodically until it can",
					"dir", d, "error", err, "interval", interval)
			}
		}
	}

	_ = r.Reload() // logged and counted by Reload

	tick := time.NewTicker(interval)
	defer tick.Stop()
	debounce := time.NewTimer(debounceDelay)
	debounce.Stop()
	defer debounce.Stop()

	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			// Any event in the directories, including on dot names (the
			// "..data" swap) and unrelated files: a reload of unchanged
			// content is a no-op, a missed rotation is an outage later.
			debounce.Reset(debounceDelay)
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			r.log.Warn("certificate dir watch error", "error", err)
		case <-debounce.C:
			_ = r.Reload() // logged and counted by Reload
		case <-tick.C:
			if fw != nil {
				r.rewatch(fw, dirs)
			}
			_ = r.Reload()
		}
	}
}

// dirs returns the distinct directories of the files.
func (r *Reloader) dirs() []string {
	var dirs []string
	for _, f := range []string{r.files.Cert, r.files.Key, r.files.ClientCA} {
		if f == "" {
			continue
		}
		if d := filepath.Dir(f); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// rewatch adds the watches the kernel dropped, when a directory was
// removed, once the directory is back.
func (r *Reloader) rewatch(fw *fsnotify.Watcher, dirs []string) {
	watched := fw.WatchList()
	for _, d := range dirs {
		if !slices.Contains(watched, d) {
			if err := fw.Add(d); err == nil {
				r.log.Info("watching certificate dir again", "dir", d)
			}
		}
	}
}
