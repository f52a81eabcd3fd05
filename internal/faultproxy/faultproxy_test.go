package faultproxy

import (
	"io"
	"net"
	"testing"
	"time"
)

// echo serves, on loopback, a server that sends back what it reads.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// The delay is a link's latency: a request sent in several pieces
// arrives the delay after each piece was sent, not the delay times the
// pieces, so a benchmark through the proxy is charged one round trip per
// call, as with a real network.
func TestProxyDelayIsLatency(t *testing.T) {
	p, err := New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const delay = 100 * time.Millisecond
	p.SetDelay(delay)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	start := time.Now()
	for _, piece := range []string{"one ", "two ", "three"} {
		if _, err := c.Write([]byte(piece)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	got := make([]byte, len("one two three"))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if string(got) != "one two three" {
		t.Fatalf("echoed %q", got)
	}
	// Three pieces each held 100 ms in turn would take over 300 ms.
	if took < delay || took > 2*delay+50*time.Millisecond {
		t.Fatalf("three pieces through a %v link took %v: want one delay, not one per piece", delay, took)
	}

	p.SetDelay(0)
	start = time.Now()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, got[:1]); err != nil || time.Since(start) > delay {
		t.Fatalf("without the delay: %v after %v", err, time.Since(start))
	}
}
