// Package faultproxy is a TCP proxy for tests and benchmarks that puts a
// network's faults between a client and a real server: latency (a real
// DynamoDB or Redis is a few milliseconds away; one on loopback is not)
// and partitions. The backends' test packages share it.
package faultproxy

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is a TCP proxy on loopback that stands between a client and a
// server to inject the faults a network brings: added latency (SetDelay)
// and a partition that neither answers nor refuses (Partition). Point the
// client at Addr. A Proxy is safe for concurrent use; Close it.
type Proxy struct {
	ln     net.Listener
	target string
	delay  atomic.Int64 // nanoseconds each chunk sent to the target is held

	mu          sync.Mutex
	conns       map[net.Conn]struct{} // client sides of every live connection
	partitioned bool
	healed      chan struct{} // closed by Heal; replaced by Partition
	closed      bool
	wg          sync.WaitGroup
}

// New listens on a free loopback port and forwards every connection
// to target (host:port).
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, healed: make(chan struct{})}
	close(p.healed)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetDelay holds everything a client sends for d before passing it on,
// as a link d long would, so each request takes d longer; 0 removes the
// delay.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Partition cuts every open connection and, until Heal, accepts new ones
// but passes nothing through: calls hang until their deadline, as when a
// network drops packets, instead of failing at once as they do against a
// killed server.
func (p *Proxy) Partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.partitioned {
		p.partitioned = true
		p.healed = make(chan struct{})
	}
	for c := range p.conns {
		c.Close()
	}
}

// Heal ends a partition: connections held during it are closed (their
// calls failed long ago) and new ones are forwarded again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.partitioned {
		p.partitioned = false
		close(p.healed)
	}
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.Heal()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		p.conns[c] = struct{}{}
		healed, partitioned := p.healed, p.partitioned
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.forget(c)
			if partitioned {
				<-healed // hold the connection, silent, until the partition ends
				return
			}
			p.forward(c)
		}()
	}
}

func (p *Proxy) forget(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// forward copies both ways between c and a new connection to the target
// until either side closes.
func (p *Proxy) forward(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return // the client sees its connection closed, as with a refused one
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() {
		p.copyDelayed(up, c)
		up.Close()
		done <- struct{}{}
	}()
	go func() {
		io.Copy(c, up)
		c.Close()
		done <- struct{}{}
	}()
	<-done
	<-done
}

// copyDelayed passes what src sends on to dst, each chunk the delay after
// it arrived, as a link with that latency would: a request that arrives
// in several chunks is late by the delay once, not once per chunk.
func (p *Proxy) copyDelayed(dst io.Writer, src io.Reader) {
	type chunk struct {
		data []byte
		due  time.Time
	}
	chunks := make(chan chunk, 64)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				chunks <- chunk{buf[:n], time.Now().Add(time.Duration(p.delay.Load()))}
			}
			if err != nil {
				return
			}
		}
	}()
	failed := false
	for c := range chunks {
		if failed {
			continue // drain, so the reader is not left blocked
		}
		if wait := time.Until(c.due); wait > 0 {
			time.Sleep(wait)
		}
		if _, err := dst.Write(c.data); err != nil {
			failed = true
		}
	}
}
