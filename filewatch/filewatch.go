// Package filewatch tells its caller when files in a few directories may
// have changed, for the config and certificate reloaders: on file events,
// after a burst of them has settled, and on a period as a safety net.
//
// Events are watched on the directories, not the files: a file renamed
// over, or a Kubernetes volume's "..data" symlink swapped, is an event in
// its directory, and a watch on the old file would go with it. Each
// directory's parent is watched too, for the events that name the
// directory itself: one removed and created again, renamed away and
// replaced, or a symlink to it swapped. After such an event the watch is
// set again on whatever the path now is, so recovery does not wait for the
// period. The period catches what events miss: a parent that cannot be
// watched, a path that is a symlink into another directory, network file
// systems. The caller's reload must therefore be cheap and idempotent when
// nothing changed.
package filewatch

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
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
		ws     *watches
		events <-chan fsnotify.Event
		errs   <-chan error
	)
	if !o.NoEvents {
		fw, err := fsnotify.NewWatcher()
		if err != nil {
			log.Warn("file events unavailable, checking "+o.What+" periodically only", "error", err, "interval", o.Interval)
		} else {
			defer fw.Close()
			events, errs = fw.Events, fw.Errors
			ws = newWatches(fw, o, log)
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
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			// Any event in a directory, on dot names and unrelated files
			// too: a reload of unchanged content is a no-op, a missed change
			// an outage later. Of the parents' events, only those that name
			// a directory itself.
			if ws.relevant(ev.Name) {
				debounce.Reset(o.Debounce)
			}
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			log.Warn(o.What+" watch error", "error", err)
		case <-debounce.C:
			ws.refresh()
			reload()
		case <-tick.C:
			ws.refresh()
			reload()
		}
	}
}

// watches keeps an fsnotify watch on each directory, and on its parent,
// set on what the path is now.
type watches struct {
	fw      *fsnotify.Watcher
	dirs    []string               // cleaned
	parents []string               // of dirs, less those that are dirs themselves
	on      map[string]os.FileInfo // the directory each dir's watch was set on
	what    string
	log     *slog.Logger
}

func newWatches(fw *fsnotify.Watcher, o Options, log *slog.Logger) *watches {
	ws := &watches{fw: fw, on: make(map[string]os.FileInfo), what: o.What, log: log}
	for _, d := range o.Dirs {
		if d = filepath.Clean(d); !slices.Contains(ws.dirs, d) {
			ws.dirs = append(ws.dirs, d)
		}
	}
	for _, d := range ws.dirs {
		if p := filepath.Dir(d); !slices.Contains(ws.dirs, p) && !slices.Contains(ws.parents, p) {
			ws.parents = append(ws.parents, p)
		}
	}
	for _, d := range ws.dirs {
		if err := ws.watch(d); err != nil {
			log.Warn("cannot watch "+o.What+", checking it periodically until it can", "dir", d, "error", err, "interval", o.Interval)
		}
	}
	for _, p := range ws.parents {
		// Without it, a directory that comes back is found by the period:
		// slower, not wrong.
		if err := fw.Add(p); err != nil {
			log.Debug("cannot watch the parent of "+o.What, "dir", p, "error", err)
		}
	}
	return ws
}

// watch sets d's watch on the directory the path names now.
func (ws *watches) watch(d string) error {
	fi, err := os.Stat(d)
	if err != nil {
		return err
	}
	_ = ws.fw.Remove(d) // a watch left on a directory renamed away, if any
	if err := ws.fw.Add(d); err != nil {
		return err
	}
	ws.on[d] = fi
	return nil
}

// relevant reports whether an event on name may change what a reload
// reads: anything in a directory, or the directory itself. A nil ws (no
// events) has none.
func (ws *watches) relevant(name string) bool {
	if ws == nil {
		return false
	}
	name = filepath.Clean(name)
	return slices.Contains(ws.dirs, name) || slices.Contains(ws.dirs, filepath.Dir(name))
}

// refresh sets the watches the kernel dropped, or that stayed on a
// directory that was replaced, once the path names a directory again.
func (ws *watches) refresh() {
	if ws == nil {
		return
	}
	watched := ws.fw.WatchList()
	for _, d := range ws.dirs {
		fi, err := os.Stat(d)
		if err != nil {
			continue // gone: its parent's event or the period brings it back
		}
		if prev, ok := ws.on[d]; ok && os.SameFile(prev, fi) && slices.Contains(watched, d) {
			continue
		}
		if err := ws.watch(d); err == nil {
			ws.log.Info("watching "+ws.what+" again", "dir", d)
		}
	}
	for _, p := range ws.parents {
		if !slices.Contains(watched, p) {
			_ = ws.fw.Add(p) // as in newWatches
		}
	}
}
