package rlqstest

import (
	"fmt"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rl/sluice/descriptors"
)

// Rules is one fixed mapping config, as a quota service reads it.
type Rules struct{ Config *descriptors.Config }

// Current returns the config.
func (r Rules) Current() *descriptors.Config { return r.Config }

// OneLimit is the domain "quota" whose bucket {api: <any>} is limited to
// rate a second with a burst of as much, and whose bucket {open: <any>}
// is matched by a rule with no limit.
func OneLimit(tb testing.TB, rate int) Rules {
	tb.Helper()
	cfg, err := descriptors.Parse(map[string][]byte{"quota.yaml": fmt.Appendf(nil, `
domain: quota
descriptors:
  - key: api
    rate_limit: {unit: second, requests_per_unit: %d}
  - key: open
`, rate)})
	if err != nil {
		tb.Fatal(err)
	}
	return Rules{cfg}
}

// Serve serves register's services on a loopback port until the test
// ends and returns a plaintext connection to it; opts are the client's.
func Serve(tb testing.TB, register func(*grpc.Server), opts ...grpc.DialOption) *grpc.ClientConn {
	tb.Helper()
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(16 << 20))
	register(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(16 << 20))}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return conn
}
