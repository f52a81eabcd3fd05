// Package redistest runs a real redis-server (the Debian package) for
// integration tests: never a mock.
//
//	srv := redistest.Require(t) // skips (fails with CI=true) without redis-server
//	// connect to srv.Addr(), or give srv.URL() to --redis-url
//
// Each Require starts a server of its own on a free loopback port, in
// memory (no RDB, no AOF), and stops it in t.Cleanup: redis-server starts
// in milliseconds, so tests need not share one. Kill, Restart, Pause and
// Resume play the faults a backend must survive.
package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/childproc"
)

// StartTimeout bounds how long Start waits for the server to answer PING.
const StartTimeout = 10 * time.Second

// ErrUnavailable is wrapped by Start's error when redis-server is not
// installed: the machine cannot run these tests, as opposed to a server
// that failed to start.
var ErrUnavailable = errors.New("redis-server is unavailable")

// Options change how a server runs.
type Options struct {
	// Config is more configuration, as redis-server's command-line
	// directives without the dashes: {"maxmemory", "2mb",
	// "maxmemory-policy", "noeviction"}.
	Config []string
	// TLS, when set, serves TLS only, with this certificate, key and CA
	// bundle (the CA verifies client certificates, which are optional).
	// The harness's own connections (Ping, Do) trust the server blindly.
	TLS *TLSFiles
	// Password, when set, is required of clients (requirepass); the
	// harness's own connections send it.
	Password string
	// Sentinel, when set, runs a Sentinel instead of a server, watching
	// the primary named Name at Primary (a quorum of one).
	Sentinel *Sentinel
}

// Sentinel is what a Sentinel watches.
type Sentinel struct {
	Name    string
	Primary *Server
}

// TLSFiles are the PEM files of a TLS server.
type TLSFiles struct {
	Cert, Key, CA string
}

// Server is a running redis-server.
type Server struct {
	bin, dir string
	port     int
	opts     Options

	proc childproc.Current
}

// Start starts redis-server on a free loopback port and waits (up to
// StartTimeout, or ctx) until it answers PING. ctx bounds the start only:
// call Stop.
func Start(ctx context.Context, dir string, o Options) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("%w: redis-server not found in PATH", ErrUnavailable)
	}
	var s *Server
	err = childproc.OnFreePort(ctx, func(port int) error {
		s = &Server{bin: bin, dir: dir, port: port, opts: o}
		return s.start(ctx)
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) start(ctx context.Context) error {
	port := []string{"--port", strconv.Itoa(s.port)}
	if t := s.opts.TLS; t != nil {
		port = []string{"--port", "0", "--tls-port", strconv.Itoa(s.port), "--tls-cert-file", t.Cert,
			"--tls-key-file", t.Key, "--tls-ca-cert-file", t.CA, "--tls-auth-clients", "optional"}
	}
	if s.opts.Password != "" {
		port = append(port, "--requirepass", s.opts.Password)
	}
	var args []string
	if sn := s.opts.Sentinel; sn != nil {
		// A Sentinel rewrites its configuration file, so it needs one.
		conf := filepath.Join(s.dir, "sentinel-"+strconv.Itoa(s.port)+".conf")
		text := fmt.Sprintf("port %d\nbind 127.0.0.1\nsentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 1000\n",
			s.port, sn.Name, sn.Primary.port, sn.Name)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			return fmt.Errorf("redistest: %w", err)
		}
		args = []string{conf, "--sentinel"}
		port = nil
	}
	args = append(append(args, port...), "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning")
	for i := 0; i+1 < len(s.opts.Config); i += 2 {
		args = append(args, "--"+s.opts.Config[i], s.opts.Config[i+1])
	}
	p, err := childproc.Start(exec.Command(s.bin, args...))
	if err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	s.proc.Set(p)
	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	for {
		err := s.Ping(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-p.Done():
			return fmt.Errorf("redistest: redis-server exited: %v\n--- its output ---\n%s", p.Err(), p.Output())
		case <-ctx.Done():
			p.Kill()
			return fmt.Errorf("redistest: redis-server did not answer on %s: %w (last: %v)\n--- its output ---\n%s", s.Addr(), ctx.Err(), err, p.Output())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is the server's redis:// URL, database 0.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Ping sends PING on a connection of its own and checks for PONG.
func (s *Server) Ping(ctx context.Context) error {
	reply, err := s.Do(ctx, "PING")
	if err == nil && reply != "PONG" {
		err = fmt.Errorf("PING answered %q", reply)
	}
	return err
}

// Do sends one command on a connection of its own and returns the reply
// line without its type byte (an error reply is returned as an error).
// It is for tests setting up or inspecting the server with simple
// commands (CONFIG SET, DBSIZE, TTL), not a client.
func (s *Server) Do(ctx context.Context, args ...string) (string, error) {
	var conn net.Conn
	var err error
	if s.opts.TLS != nil {
		d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}} // the harness's own connection
		conn, err = d.DialContext(ctx, "tcp", s.Addr())
	} else {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", s.Addr())
	}
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	} else {
		conn.SetDeadline(time.Now().Add(5 * time.Second))
	}
	var b strings.Builder
	command := func(args ...string) {
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
	}
	if s.opts.Password != "" {
		command("AUTH", s.opts.Password)
	}
	command(args...)
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	if s.opts.Password != "" {
		if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
			return "", fmt.Errorf("AUTH: %q %v", line, err)
		}
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return line[1:], nil
}

// SetPassword changes the password clients must give (CONFIG SET
// requirepass): connections already authenticated stay so until closed.
func (s *Server) SetPassword(ctx context.Context, password string) error {
	if _, err := s.Do(ctx, "CONFIG", "SET", "requirepass", password); err != nil {
		return err
	}
	s.opts.Password = password
	return nil
}

// Stop kills the server. It is safe to call more than once.
func (s *Server) Stop() { s.Kill() }

// Kill ends the server at once with SIGKILL, as a crash would: its data
// is gone, connections are reset and new ones refused until Restart.
func (s *Server) Kill() { s.proc.Kill() }

// Restart starts the server again, empty, on the same port after Kill.
func (s *Server) Restart(ctx context.Context) error {
	s.Kill()
	return s.start(ctx)
}

// Pause freezes the server (SIGSTOP): connections stay open and nothing
// answers, as a server that hangs. Resume thaws it.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume thaws a paused server (SIGCONT).
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error { return s.proc.Proc().Signal(sig) }

// Require returns a redis-server for this test alone, stopped in
// tb.Cleanup. Without redis-server the test is skipped with a message
// saying how to install it, but with CI=true it fails: CI must run every
// test. A server that is there but does not start always fails the test.
func Require(tb testing.TB) *Server { return RequireWith(tb, Options{}) }

// RequireWith is Require with Options.
func RequireWith(tb testing.TB, o Options) *Server {
	tb.Helper()
	srv, err := Start(context.Background(), tb.TempDir(), o)
	if err == nil {
		tb.Cleanup(srv.Stop) // SIGKILL ends a paused server too
	}
	childproc.Require(tb, err, ErrUnavailable, `To run the Redis integration tests:
  - redis-server:   apt-get install redis-server (.ci/run installs it in CI)`)
	return srv
}
