// Package filewatch tells its caller when files in a few directories may
// have changed, for the config and certificate reloaders: on file events,
// after a burst of them has settled, and on a period as a safety net.
//
// Events are watched on the directories, not the files: a file renamed
// over, or a Kubernetes volume's "..data" symlink swapped, is an event in
// its directory, and a watch on the old file would go with it. The period
// catches what events miss: a path that is a symlink into another
// directory, a directory removed and created again (its watch is added
// back once it exists), network file systems. The caller's reload must
// therefore be cheap and idempotent when nothing changed.
package filewatch

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Options configure Run. Zero durations are not defaults: give both.
type Options struct {
	// Dirs are the directories to watch.
	Dirs []string
	// Debounce is how long a burst of events must settle before a reload.
	Debounce time.Duration
	// Interval is the period of the safety-net reload.
	Interval time.Duration
	// NoEvents turns file events off, leaving the period only (tests of
	// that fallback).
	NoEvents bool
	// What names the directories in log lines ("config dir").
	What string
	// Log receives warnings about watches that cannot be set up; nil
	// discards them.
	Log *slog.Logger
}

// Run calls reload once its watches are in place (so that a change made
// before Run started is not missed), then whenever the directories may
// have changed, until ctx is done. It blocks: run it in a goroutine and
// wait for it to return to stop it cleanly. A watch that cannot start is
// logged and the period still reloads: worth a warning, not a refusal to
// serve.
func Run(ctx context.Context, o Options, reload func()) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var (
		fw     *fsnotify.Watcher
		events <-chan fsnotify.Event
		errs   <-chan error
	)
	if !o.NoEvents {
		var err error
		if fw, err = fsnotify.NewWatcher(); err != nil {
			log.Warn("file events unavailable, checking "+o.What+" periodically only", "error", err, "interval", o.Interval)
			fw = nil
		} else {
			defer fw.Close()
			events, errs = fw.Events, fw.Errors
			for _, d := range o.Dirs {
				if err := fw.Add(d); err != nil {
					log.Warn("cannot watch "+o.What+", checking it periodically until it can", "dir", d, "error", err, "interval", o.Interval)
				}
			}
		}
	}

	reload()

	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	debounce := time.NewTimer(o.Debounce)
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
			// Any event, on dot names and unrelated files too: a reload of
			// unchanged content is a no-op, a missed change an outage later.
			debounce.Reset(o.Debounce)
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			log.Warn(o.What+" watch error", "error", err)
		case <-debounce.C:
			reload()
		case <-tick.C:
			if fw != nil {
				rewatch(fw, o.Dirs, o.What, log)
			}
			reload()
		}
	}
}

// rewatch adds back the watches the kernel dropped when a directory was
// removed, once the directory exists again.
func rewatch(fw *fsnotify.Watcher, dirs []string, what string, log *slog.Logger) {
	watched := fw.WatchList()
	for _, d := range dirs {
		if !slices.Contains(watched, d) {
			if err := fw.Add(d); err == nil {
				log.Info("watching "+what+" again", "dir", d)
			}
		}
	}
}
