// Command delayproxy puts a network's latency between Sluice and its
// store for the fleet benchmarks: DynamoDB Local, or a redis-server.
// Either on loopback answers in well under a millisecond, where real
// DynamoDB is a few milliseconds away and a real Redis 0.2 to 1 ms, so a
// benchmark straight against it flatters every design that waits on the
// store. delayproxy listens on a free loopback port, prints its endpoint
// on stdout (an http:// URL, as the SDK and --endpoint want it; with
// -plain its host:port, for redis://), and forwards every connection to
// -target, holding what clients send for -delay (internal/faultproxy,
// the proxy of the backends' tests), until it is interrupted or
// terminated.
//
//	go run ./bench/delayproxy -target 127.0.0.1:8000 -delay 5ms
//	go run ./bench/delayproxy -target 127.0.0.1:6379 -delay 500us -plain
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sluice-rl/sluice/internal/faultproxy"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run returns the exit code: 0 after a signal, 1 an error, 2 a bad
// command line.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("delayproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	target := fs.String("target", "", "forward to this loopback `host:port` (DynamoDB Local, redis-server)")
	delay := fs.Duration("delay", 5*time.Millisecond, "latency added to every request")
	plain := fs.Bool("plain", false, "print the proxy's host:port instead of an http:// URL (for Redis)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	host, _, err := net.SplitHostPort(*target)
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "delayproxy: -target %q: %v\n", *target, err)
		return 2
	case !(host == "localhost" || net.ParseIP(host).IsLoopback()):
		fmt.Fprintf(stderr, "delayproxy: -target %q: only loopback targets are allowed\n", *target)
		return 2
	case *delay < 0:
		fmt.Fprintf(stderr, "delayproxy: -delay %v: want 0 or more\n", *delay)
		return 2
	}
	p, err := faultproxy.New(*target)
	if err != nil {
		fmt.Fprintln(stderr, "delayproxy:", err)
		return 1
	}
	p.SetDelay(*delay)
	if *plain {
		fmt.Fprintln(stdout, p.Addr())
	} else {
		fmt.Fprintln(stdout, "http://"+p.Addr())
	}
	<-ctx.Done()
	if err := p.Close(); err != nil {
		fmt.Fprintln(stderr, "delayproxy:", err)
		return 1
	}
	return 0
}
