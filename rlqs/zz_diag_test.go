package rlqs_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"google.golang.org/grpc"

	"github.com/sluice-rl/sluice/backend"
	ddb "github.com/sluice-rl/sluice/backend/dynamodb"
	"github.com/sluice-rl/sluice/backend/dynamodb/dynamodbtest"
	rds "github.com/sluice-rl/sluice/backend/redis"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
	"github.com/sluice-rl/sluice/rlqs"
)

type diagTally struct {
	backend.Backend
	checks, takes, denied, refunds atomic.Int64
}

func (c *diagTally) Decide(ctx context.Context, req *backend.Request) (backend.Decision, error) {
	d, err := c.Backend.Decide(ctx, req)
	switch {
	case req.Refund:
		c.refunds.Add(1)
	case req.Hits == 0:
		c.checks.Add(1)
	case err == nil && d.Allowed:
		c.takes.Add(1)
	default:
		c.denied.Add(1)
	}
	return d, err
}

func diagRun(t *testing.T, open func() backend.Backend, writes func() int64) {
	var conns []*grpc.ClientConn
	var svcs []*rlqs.Service
	var tallies []*diagTally
	for range 3 {
		tl := &diagTally{Backend: open()}
		svc, conn := replica(t, rules(t, 1000), tl, rlqs.Options{})
		conns, svcs, tallies = append(conns, conn), append(svcs, svc), append(tallies, tl)
	}
	const n, seconds = 10, 45
	f := newFleet(t, conns, n, seconds)
	var tbs, ws [seconds + 1]int64
	f.run(func(sec int) {
		for _, s := range svcs {
			tbs[sec] += int64(s.Stats().TokenBuckets)
		}
		ws[sec] = writes()
		if sec == 0 {
			for i := range n {
				f.demand[i].Store(50)
			}
		}
	})
	var tb, deny uint64
	var checks, takes, denied, refunds int64
	for i, s := range svcs {
		st := s.Stats()
		tb += st.TokenBuckets
		deny += st.DenyAll
		checks += tallies[i].checks.Load()
		takes += tallies[i].takes.Load()
		denied += tallies[i].denied.Load()
		refunds += tallies[i].refunds.Load()
	}
	var asked uint64
	for i := range n {
		for s := range 10 {
			asked += f.asked[i][s]
		}
	}
	t.Logf("token buckets %d, deny_all %d; store writes %d; decisions: checks %d takes %d denied %d refunds %d", tb, deny, writes(), checks, takes, denied, refunds)
	t.Logf("denied before the second report: %d of %d; after %d", f.denied(all(n), 0, 10), asked, f.denied(all(n), 10, seconds))
	per := make([]uint64, seconds)
	for s := range per {
		per[s] = f.denied(all(n), s, s+1)
	}
	t.Logf("denied each second %v", per)
	var dt, dw []int64
	for s := range seconds - 1 {
		dt = append(dt, tbs[s+1]-tbs[s])
		dw = append(dw, ws[s+1]-ws[s])
	}
	t.Logf("assignments each second %v", dt)
	t.Logf("writes each second      %v", dw)
}

func TestDiagDynamoDB(t *testing.T) {
	srv := dynamodbtest.Require(t)
	table := srv.NewTable(t, func(ctx context.Context, c *dynamodb.Client, name string) error {
		_, err := ddb.CreateTable(ctx, c, name)
		return err
	})
	proxy, err := dynamodbtest.NewProxy(strings.TrimPrefix(srv.Endpoint(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	proxy.SetDelay(5 * time.Millisecond)
	var bes []*ddb.Backend
	diagRun(t, func() backend.Backend {
		be, err := ddb.New(srv.ClientAt(proxy.Endpoint()), ddb.Options{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		bes = append(bes, be)
		return be
	}, func() int64 {
		var w uint64
		for _, b := range bes {
			c, _ := b.Stats().Calls()
			w += c["UpdateItem"] + c["PutItem"] + c["TransactWriteItems"]
			//t.Logf("calls %v conditionRetries %d contended %d", c, b.Stats().ConditionRetries.Load(), b.Stats().Contended.Load())
		}
		return int64(w)
	})
}

func TestDiagRedis(t *testing.T) {
	srv := redistest.Require(t)
	var bes []*rds.Backend
	diagRun(t, func() backend.Backend {
		client, err := rds.Dial(context.Background(), rds.Conn{URL: srv.URL()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(client.Close)
		be, err := rds.New(client, rds.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		bes = append(bes, be)
		return be
	}, func() int64 {
		var w uint64
		for _, b := range bes {
			w += b.Stats().Scripts.Load()
		}
		return int64(w)
	})
}
