package descriptors

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Config is one loaded, immutable mapping config. Safe for concurrent use.
type Config struct {
	domains     map[string]level  // domain -> top level of its descriptor tree
	names       map[string]string // domain -> the file's top-level name, when it has one
	domainNames []string          // sorted
	rules       []*Rule           // every node, files in name order, nodes in pre-order
	fingerprint string
}

// Load reads every *.yaml and *.yml file of dir (following symlinks,
// skipping names that start with "." such as the "..data" link of a
// Kubernetes ConfigMap volume) and builds a Config from them. The error, if
// any, joins every problem found, each as "file:line: message".
func Load(dir string) (*Config, error) {
	files, err := readDir(dir)
	if err != nil {
		return nil, err
	}
	return parse(files, fingerprint(files))
}

// Parse builds a Config from file contents held in memory (base name ->
// content), exactly as Load does from a directory. Every file given is
// parsed, whatever its name.
func Parse(files map[string][]byte) (*Config, error) {
	return parse(files, fingerprint(files))
}

// HasDomain reports whether a rule file defines domain.
func (c *Config) HasDomain(domain string) bool {
	_, ok := c.domains[domain]
	return ok
}

// Name returns the top-level name of the file that defines domain ("" when
// it has none). envoyproxy/ratelimit's newer format carries one (Envoy
// Gateway writes its listener's name there); it names the file, and
// changes nothing in matching.
func (c *Config) Name(domain string) string { return c.names[domain] }

// Domains returns the names of the configured domains, sorted.
func (c *Config) Domains() []string { return slices.Clone(c.domainNames) }

// Rules returns every rule node: files in name order, and in each file the
// nodes in the order they are written (a parent before its children).
func (c *Config) Rules() []*Rule { return slices.Clone(c.rules) }

// Fingerprint is a hash of the file names and contents the Config was built
// from. Two Configs built from the same files have the same fingerprint.
func (c *Config) Fingerprint() string { return c.fingerprint }

// readDir returns the YAML files of dir that Load considers, by base name.
func readDir(dir string) (map[string][]byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read config dir: %w", err)
	}
	files := make(map[string][]byte, len(entries))
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !isYAML(name) {
			continue
		}
		path := filepath.Join(dir, name)
		// Stat, not the DirEntry type: a ConfigMap file is a symlink into
		// the "..data" directory and must be followed.
		fi, err := os.Stat(path)
		if err != nil {
			errs = append(errs, &Error{File: name, Msg: err.Error(), Err: err})
			continue
		}
		if !fi.Mode().IsRegular() {
			continue // a directory that happens to be called x.yaml
		}
		data, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, &Error{File: name, Msg: err.Error(), Err: err})
			continue
		}
		files[name] = data
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return files, nil
}

func isYAML(name string) bool {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml":
		return true
	}
	return false
}

// fingerprint hashes names and contents in name order. Lengths are hashed
// too, so that no two different file sets share a byte stream.
func fingerprint(files map[string][]byte) string {
	h := sha256.New()
	var n [8]byte
	for _, name := range sortedNames(files) {
		binary.BigEndian.PutUint64(n[:], uint64(len(name)))
		h.Write(n[:])
		h.Write([]byte(name))
		binary.BigEndian.PutUint64(n[:], uint64(len(files[name])))
		h.Write(n[:])
		h.Write(files[name])
	}
	return hex.EncodeToString(h.Sum(nil))
}

func sortedNames(files map[string][]byte) []string {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
