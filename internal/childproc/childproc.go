// Package childproc runs the real servers integration tests need
// (DynamoDB Local, redis-server) as child processes that never outlive
// the test binary, and holds what their test harnesses share: a free
// port, the output kept for error messages, and the rule that a test
// missing a component skips on a workstation but fails under CI=true.
package childproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"testing"
	"time"
)

// Proc is one run of a server process. Its output (the first MiB) is
// kept for error messages.
type Proc struct {
	cmd      *exec.Cmd
	out      *Output
	done     chan struct{} // closed when the process has exited
	waitErr  error         // valid after done
	stopOnce sync.Once
}

// Start starts cmd in a process group of its own, so that Kill ends
// everything it started; on Linux the kernel also kills it when the test
// binary dies without Kill (a panic, a timeout, a SIGKILL). Its stdout
// and stderr go to the Proc's Output.
func Start(cmd *exec.Cmd) (*Proc, error) {
	out := &Output{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	p := &Proc{cmd: cmd, out: out, done: make(chan struct{})}
	// Started and waited for on one locked OS thread: the child gets
	// SIGKILL when the thread that forked it exits (Pdeathsig), so the
	// thread must live as long as the child.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	return p, nil
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is how the process exited; valid once Done is closed.
func (p *Proc) Err() error { return p.waitErr }

// Output is what the process wrote.
func (p *Proc) Output() string { return p.out.String() }

// Pid is the process's id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process alone (SIGSTOP freezes a server, as a
// host that stops answering would).
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Kill ends the process group at once with SIGKILL, as a crash or a lost
// host would, and waits for the process to exit. It is safe to call more
// than once.
func (p *Proc) Kill() {
	p.stopOnce.Do(func() {
		select {
		case <-p.done:
			return
		default:
		}
		killGroup(p.cmd.Process)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			// Should not happen after SIGKILL; don't hang the test binary.
			fmt.Fprintf(os.Stderr, "childproc: %s (pid %d) did not exit after SIGKILL\n", p.cmd.Path, p.cmd.Process.Pid)
		}
	})
}

// Current is the run in force of a server that tests kill and start
// again; the zero value holds none. It is safe for concurrent use.
type Current struct {
	mu sync.Mutex
	p  *Proc
}

// Set makes p the run in force.
func (c *Current) Set(p *Proc) {
	c.mu.Lock()
	c.p = p
	c.mu.Unlock()
}

// Proc is the run in force, nil before the first Set.
func (c *Current) Proc() *Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.p
}

// Kill kills the run in force (Proc.Kill), if any.
func (c *Current) Kill() {
	if p := c.Proc(); p != nil {
		p.Kill()
	}
}

// FreePort returns a loopback port free now. Another process may take it
// before the server binds it: callers retry with a new one.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// OnFreePort calls start with a free loopback port until it succeeds, up
// to three times: a port picked free may be taken before the server binds
// it. It returns start's last error.
func OnFreePort(ctx context.Context, start func(port int) error) error {
	var err error
	for range 3 {
		port, perr := FreePort()
		if perr != nil {
			return perr
		}
		if err = start(port); err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// Output keeps the first MiB written to it.
type Output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Output) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := 1<<20 - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *Output) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Require ends a test whose component could not be had: when err wraps
// unavailable (the machine lacks the component) it skips, printing how to
// install it, except under CI=true, where every integration test must
// run and it fails; any other error (a component there that did not
// start) always fails.
func Require(tb testing.TB, err, unavailable error, install string) {
	tb.Helper()
	switch {
	case err == nil:
	case errors.Is(err, unavailable) && os.Getenv("CI") != "true":
		tb.Skip(banner(err, "SKIPPED", install))
	case errors.Is(err, unavailable):
		tb.Fatal(banner(err, "FAILED (with CI=true every integration test must run)", install))
	default:
		tb.Fatal(err)
	}
}

func banner(err error, verdict, install string) string {
	return fmt.Sprintf(`
************************************************************************
%s: %v
%s
************************************************************************`, verdict, err, install)
}
