package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/sluicehq/sluice/internal/config"
)

// watchSet is what the config watcher reacts to: the config file, the
// files envoy.configs' patterns match (and any new file they would
// match), and the symbolic links through which those are reached. Any
// other file in the same directories, such as sluice's own log, is not
// the config's business: its changes are ignored, unlogged.
type watchSet struct {
	path     string          // the config file
	patterns []string        // envoy.configs, joined to the config's directory
	names    map[string]bool // cleaned paths whose change may change what load reads
	dirs     []string        // the directories to watch
}

// maxLinks bounds how many symbolic links newWatchSet follows from one
// file (a loop ends there).
const maxLinks = 40

// newWatchSet is the watch set of the config at path (cfg, as loaded).
// Directories are watched, not files: that sees editors that replace a
// file and Kubernetes ConfigMap updates, which swap the ..data link.
func newWatchSet(path string, cfg *config.Config) *watchSet {
	ws := &watchSet{path: filepath.Clean(path), names: map[string]bool{}}
	dirs := map[string]bool{filepath.Dir(ws.path): true}
	if cfg.Envoy != nil {
		for _, p := range envoyPatterns(cfg, path) {
			p = filepath.Clean(p)
			ws.patterns = append(ws.patterns, p)
			dirs[filepath.Dir(p)] = true
		}
	}
	for _, f := range ws.files() {
		ws.addChain(f)
	}
	for d := range dirs {
		ws.dirs = append(ws.dirs, d)
	}
	sort.Strings(ws.dirs)
	return ws
}

// files are the files load would read now: the config file and the
// pattern's matches, sorted after the config file.
func (ws *watchSet) files() []string {
	files := []string{ws.path}
	seen := map[string]bool{ws.path: true}
	var matched []string
	for _, p := range ws.patterns {
		ms, _ := filepath.Glob(p) // a bad pattern matches nothing; load says why
		for _, m := range ms {
			if m = filepath.Clean(m); !seen[m] {
				seen[m] = true
				matched = append(matched, m)
			}
		}
	}
	sort.Strings(matched)
	return append(files, matched...)
}

// addChain adds f, every symbolic link on the way from f to the file it
// names, and the links among their directories (a ConfigMap's ..data).
func (ws *watchSet) addChain(f string) {
	for range maxLinks {
		ws.names[f] = true
		for d := filepath.Dir(f); d != filepath.Dir(d); d = filepath.Dir(d) {
			if fi, err := os.Lstat(d); err == nil && fi.Mode()&os.ModeSymlink != 0 {
				ws.names[d] = true
			}
		}
		target, err := os.Readlink(f)
		if err != nil {
			return // not a link (or gone): the end of the chain
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(f), target)
		}
		f = filepath.Clean(target)
	}
}

// relevant reports whether a change to the file name may change what
// load reads.
func (ws *watchSet) relevant(name string) bool {
	name = filepath.Clean(name)
	if ws.names[name] {
		return true
	}
	for _, p := range ws.patterns {
		if ok, _ := filepath.Match(p, name); ok {
			return true
		}
	}
	return false
}

// fingerprint digests what the files of ws hold now, so that events that
// leave them as they were (a touch, a chmod, an editor's rename dance,
// one save reported as several writes) are one reload attempt at most.
func (ws *watchSet) fingerprint() string {
	h := sha256.New()
	for _, f := range ws.files() {
		data, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(h, "%s\x00missing\x00", f)
			continue
		}
		fmt.Fprintf(h, "%s\x00%d:%s", f, len(data), data)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// watcher reports changes in a set of directories. A nil *watcher
// reports nothing.
type watcher struct {
	w       *fsnotify.Watcher
	watched map[string]bool
	log     *slog.Logger
}

func newWatcher(log *slog.Logger) (*watcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	return &watcher{w: w, watched: map[string]bool{}, log: log}, nil
}

// add watches dirs not yet watched; a directory that cannot be watched
// is logged and skipped (SIGHUP still reloads).
func (w *watcher) add(dirs []string) {
	if w == nil {
		return
	}
	for _, d := range dirs {
		if w.watched[d] {
			continue
		}
		if err := w.w.Add(d); err != nil {
			w.log.Warn("cannot watch a config directory: changes there need a SIGHUP", "dir", d, "reason", err)
			continue
		}
		w.watched[d] = true
	}
}

func (w *watcher) events() <-chan fsnotify.Event {
	if w == nil {
		return nil
	}
	return w.w.Events
}

func (w *watcher) errors() <-chan error {
	if w == nil {
		return nil
	}
	return w.w.Errors
}

func (w *watcher) close() error {
	if w == nil {
		return nil
	}
	return w.w.Close()
}

// reloadDelay is how long the files must be quiet after a change before
// serve reloads: an editor or a ConfigMap update is several events.
const reloadDelay = 200 * time.Millisecond

// watchLoop reloads on SIGHUP (hup) and on changes to the config's files
// until ctx is done or served reports a server's end, which it returns.
// Without a config file (the built-in example) nothing is watched.
func (r *reloader) watchLoop(ctx context.Context, hup <-chan os.Signal, w *watcher, served <-chan error) error {
	quiet := time.NewTimer(reloadDelay)
	quiet.Stop()
	defer quiet.Stop()
	var ws *watchSet
	// fp digests the files at the last reload attempt; none yet, so the
	// first change is compared with the serving config by its hash,
	// which also sees a change made while Run was starting.
	var fp string
	rewatch := func() {
		if r.path != "" {
			ws = newWatchSet(r.path, r.cur.Load().loaded.cfg)
			w.add(ws.dirs)
		}
	}
	rewatch()
	for {
		select {
		case err := <-served:
			return err
		case <-ctx.Done():
			return nil
		case <-hup:
			r.log.Info("SIGHUP: reloading the config")
			if ws != nil {
				fp = ws.fingerprint()
			}
			r.reload("signal", true)
			rewatch()
		case ev, ok := <-w.events():
			if !ok {
				return errors.New("config watcher stopped")
			}
			if ws != nil && ws.relevant(ev.Name) {
				r.log.Debug("config file changed", "file", ev.Name, "op", ev.Op.String())
				quiet.Reset(reloadDelay)
			}
		case err := <-w.errors():
			r.log.Warn("config watcher", "reason", err)
		case <-quiet.C:
			if now := ws.fingerprint(); now != fp {
				fp = now
				r.reload("file", false)
				rewatch()
			}
		}
	}
}
