package certs

import (
	"context"
	"path/filepath"
	"slices"
	"time"

	"github.com/sluice-rl/sluice/filewatch"
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
// File events on the files' directories trigger a reload after a short
// debounce, and every interval (DefaultInterval when interval <= 0) the
// contents are compared with those in force anyway (filewatch has the
// details); unchanged contents cost a read and a hash. Watch re-reads the
// files once its watches are in place, so a change made between New and
// Watch is not missed.
func (r *Reloader) Watch(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultInterval
	}
	filewatch.Run(ctx, filewatch.Options{Dirs: r.dirs(), Debounce: debounceDelay, Interval: interval,
		What: "certificate dir", Log: r.log}, func() {
		_ = r.Reload() // logged and counted by Reload
	})
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
