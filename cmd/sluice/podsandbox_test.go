package main

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// podUID is the user and group Envoy Gateway's rate-limit pod runs as
// (its container securityContext: runAsUser and runAsGroup 65534, with a
// read-only root file system).
const podUID = 65534

// podSandbox runs the sluice binary as Envoy Gateway's pod does: as user
// podUID, from a directory it cannot write, with only files it can read.
// That user can write nowhere on this machine's root file system but in
// the world-writable directories (worldWritable), which
// checkNothingWritten searches afterwards for anything it left: together,
// what a read-only root file system would refuse.
//
// Switching users needs root; CI runs as root. Elsewhere the binary runs
// as the current user and checkNothingWritten has nothing to tell.
type podSandbox struct {
	dir, bin string
	asPod    bool
	started  time.Time
}

func newPodSandbox(t *testing.T) *podSandbox {
	t.Helper()
	// Not t.TempDir: its parents are private to root (0700).
	dir, err := os.MkdirTemp("", "eg-pod-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := &podSandbox{dir: dir, asPod: os.Geteuid() == 0, started: time.Now()}
	if !p.asPod {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI runs as root, so that this test can run Sluice as Envoy Gateway's pod user; it runs as uid", os.Geteuid())
		}
		t.Logf("not root: Sluice runs as uid %d, not as the pod's %d", os.Geteuid(), podUID)
	}
	// A copy of the test binary, which runs main (runMainEnv), named as
	// Envoy Gateway starts it: the original's directory is private too.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	p.bin = filepath.Join(dir, "bin", ratelimitName)
	copyFile(t, exe, p.bin, 0o755)
	return p
}

// file writes data to name in the sandbox, readable by the pod's user (a
// Secret volume's default mode, 0644), and returns its path.
func (p *podSandbox) file(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// copy puts a copy of the file at path in the sandbox.
func (p *podSandbox) copy(t *testing.T, path string) string {
	t.Helper()
	dst := filepath.Join(p.dir, filepath.Base(path))
	copyFile(t, path, dst, 0o644)
	return dst
}

func (p *podSandbox) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = p.dir
	if p.asPod {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: podUID, Gid: podUID}}
	}
	return cmd
}

// checkUser fails the test unless pid runs as the pod's user.
func (p *podSandbox) checkUser(t *testing.T, pid int) {
	t.Helper()
	if !p.asPod {
		return
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("Uid:\t%d\t%d\t%d\t%d\n", podUID, podUID, podUID, podUID)
	if !strings.Contains(string(raw), want) {
		t.Errorf("Sluice does not run as the pod's user %d:\n%s", podUID, raw)
	}
}

// worldWritable are the directories of a root file system any user may
// write in.
func worldWritable() []string {
	dirs := []string{"/tmp", "/var/tmp", "/dev/shm", "/run/lock"}
	if t := filepath.Clean(os.TempDir()); !slices.Contains(dirs, t) {
		dirs = append(dirs, t)
	}
	return dirs
}

// checkNothingWritten fails the test if the pod's user created or changed
// anything in the world-writable directories since the sandbox was made.
func (p *podSandbox) checkNothingWritten(t *testing.T) {
	t.Helper()
	if !p.asPod {
		return
	}
	for _, root := range worldWritable() {
		filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil // gone, or private to another user: not the pod's
			}
			info, err := d.Info()
			if err != nil {
				return nil
			}
			if st, ok := info.Sys().(*syscall.Stat_t); ok && st.Uid == podUID && !info.ModTime().Before(p.started) {
				t.Errorf("Sluice wrote %s, which a read-only root file system refuses", path)
			}
			return nil
		})
	}
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
