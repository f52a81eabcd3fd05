// Command delayproxy puts a network's latency between Sluice and
// DynamoDB Local for the fleet benchmarks. DynamoDB Local on loopback
// answers in well under a millisecond, where real DynamoDB is a few
// milliseconds away, so a benchmark straight against it flatters every
// design that waits on a write. delayproxy listens on a free loopback
// port, prints its endpoint URL on stdout, and forwards every connection
// to -target, holding what clients send for -delay (the proxy of
// backend/dynamodb/dynamodbtest), until it is interrupted or terminated.
//
//	go run ./bench/delayproxy -target 127.0.0.1:8000 -delay 5ms
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

	"github.com/sluice-rl/sluice/backend/dynamodb/dynamodbtest"
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
	target := fs.String("target", "", "forward to this loopback `host:port` (DynamoDB Local)")
	delay := fs.Duration("delay", 5*time.Millisecond, "latency added to every request")
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
	p, err := dynamodbtest.NewProxy(*target)
	if err != nil {
		fmt.Fprintln(stderr, "delayproxy:", err)
		return 1
	}
	p.SetDelay(*delay)
	fmt.Fprintln(stdout, p.Endpoint())
	<-ctx.Done()
	if err := p.Close(); err != nil {
		fmt.Fprintln(stderr, "delayproxy:", err)
		return 1
	}
	return 0
}
