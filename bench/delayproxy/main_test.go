package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// The command prints an endpoint that forwards to the target with the
// delay, and exits cleanly when its context ends: an http:// URL by
// default, for DynamoDB, and a plain host:port with -plain, for Redis.
func TestRun(t *testing.T) {
	t.Run("url", func(t *testing.T) { testRun(t, "http://") })
	t.Run("plain", func(t *testing.T) { testRun(t, "", "-plain") })
}

func testRun(t *testing.T, scheme string, flags ...string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.Copy(c, c)
			c.Close()
		}
	}()

	ctx, cancel := context.WithCancel(t.Context())
	r, w := io.Pipe()
	var stderr bytes.Buffer
	done := make(chan int)
	go func() {
		done <- run(ctx, append([]string{"-target", ln.Addr().String(), "-delay", "30ms"}, flags...), w, &stderr)
		w.Close()
	}()
	line := make([]byte, 64)
	n, err := r.Read(line)
	if err != nil {
		t.Fatal(err)
	}
	endpoint := strings.TrimSpace(string(line[:n]))
	hostPort, ok := strings.CutPrefix(endpoint, scheme)
	if _, _, err := net.SplitHostPort(hostPort); !ok || err != nil {
		t.Fatalf("endpoint %q: want %shost:port", endpoint, scheme)
	}
	c, err := net.Dial("tcp", hostPort)
	if err != nil {
		t.Fatalf("endpoint %q: %v", endpoint, err)
	}
	start := time.Now()
	c.Write([]byte("ping"))
	got := make([]byte, 4)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "ping" || time.Since(start) < 30*time.Millisecond {
		t.Fatalf("through %s: %q, %v after %v: want ping back after at least 30ms", endpoint, got, err, time.Since(start))
	}
	c.Close()
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d after the signal: %s", code, stderr.String())
	}
}

func TestRunRejects(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-target", "192.0.2.1:8000"},
		{"-target", "127.0.0.1:8000", "-delay", "-1ms"},
		{"-target", "127.0.0.1"},
	} {
		var stderr bytes.Buffer
		if code := run(t.Context(), args, io.Discard, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2 (%s)", args, code, stderr.String())
		}
	}
}
