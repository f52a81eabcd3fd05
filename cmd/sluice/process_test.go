package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// runMainEnv makes the test binary the sluice binary: set, init runs main
// with the binary's arguments and exits. Tests use it to run sluice as a
// process of its own and read everything that process writes, including
// what libraries print to os.Stderr behind the logger's back (the AWS SDK
// has a logger of its own).
const runMainEnv = "SLUICE_TEST_RUN_MAIN"

func init() {
	if os.Getenv(runMainEnv) == "1" {
		main() // exits
	}
}

// syncBuffer is a bytes.Buffer that a process or server may write while a
// test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitUntil polls cond every 20 ms until it holds, failing the test,
// with what it waited for, once timeout has passed.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
	}
}

// sluiceProcess runs `sluice args...` as a process and returns all it
// wrote, stdout and stderr, and its exit code.
func sluiceProcess(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	case err != nil:
		t.Fatalf("sluice %s: %v", strings.Join(args, " "), err)
	}
	return string(out), 0
}

// serveProcess is `sluice serve` running as a process of its own.
type serveProcess struct {
	args  []string
	cmd   *exec.Cmd
	out   *syncBuffer // stdout and stderr of the current process
	addrs map[string]string
	done  chan error // holds the current process's exit once it has exited
}

// startServeProcess runs `sluice serve args...` and returns once it logs
// that it serves; the test's end kills it.
func startServeProcess(t *testing.T, args ...string) *serveProcess {
	t.Helper()
	p := &serveProcess{args: args}
	p.start(t)
	t.Cleanup(p.kill)
	return p
}

// start runs the process and waits until it logs its addresses.
func (p *serveProcess) start(t *testing.T) {
	t.Helper()
	p.out, p.done, p.addrs = &syncBuffer{}, make(chan error, 1), nil
	p.cmd = exec.Command(os.Args[0], append([]string{"serve"}, p.args...)...)
	p.cmd.Env = append(os.Environ(), runMainEnv+"=1")
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func(cmd *exec.Cmd, done chan error) { done <- cmd.Wait() }(p.cmd, p.done)
	deadline := time.After(20 * time.Second)
	for p.addrs == nil {
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("sluice serve exited: %v\n%s", err, p.out.String())
		case <-deadline:
			t.Fatalf("sluice serve did not start within 20 s:\n%s", p.out.String())
		case <-time.After(20 * time.Millisecond):
			p.addrs = servingAddrs(p.out.String())
		}
	}
}

// kill ends the process with SIGKILL, as a lost node: no drain, no
// flush. It is safe to call after the process has exited.
func (p *serveProcess) kill() {
	p.cmd.Process.Kill()
	err := <-p.done
	p.done <- err
}

// restart kills the process and starts it again, serving gRPC and HTTP
// on the addresses it had, so its clients find it where it was.
func (p *serveProcess) restart(t *testing.T) {
	t.Helper()
	p.kill()
	p.args = append(p.args, "--grpc-addr", p.addrs["grpc"], "--http-addr", p.addrs["http"]) // the last of a flag wins
	p.start(t)
}

// stop sends SIGTERM, as Kubernetes does, and returns all the process
// wrote once it has exited.
func (p *serveProcess) stop(t *testing.T) string {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Errorf("sluice serve after SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("sluice serve still running 20 s after SIGTERM:\n%s", p.out.String())
	}
	return p.out.String()
}

// servingAddr finds the listeners' addresses in the "sluice serving" line,
// text or JSON; nil until that line is there.
var servingAddr = regexp.MustCompile(`(?:^|[ {,])"?(grpc|http|debug)"?[=:]"?([^" ,}]+)`)

func servingAddrs(log string) map[string]string {
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "sluice serving") {
			continue
		}
		if strings.HasPrefix(line, "{") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) != nil {
				continue
			}
			addrs := map[string]string{}
			for _, k := range []string{"grpc", "http", "debug"} {
				addrs[k], _ = m[k].(string)
			}
			return addrs
		}
		addrs := map[string]string{}
		for _, m := range servingAddr.FindAllStringSubmatch(line, -1) {
			addrs[m[1]] = m[2]
		}
		return addrs
	}
	return nil
}
