package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Cluster is a Redis Cluster of primaries without replicas, each a real
// redis-server on a loopback port of its own, the 16384 slots shared out
// evenly among them.
type Cluster struct {
	Nodes []*Server
}

// URL is a redis:// URL naming every node as a seed.
func (c *Cluster) URL() string {
	u := "redis://" + c.Nodes[0].Addr()
	for i, n := range c.Nodes[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u += sep + "addr=" + n.Addr()
	}
	return u
}

// RequireCluster returns a Cluster of n primaries for this test alone,
// stopped in tb.Cleanup, once every node reports cluster_state:ok. It
// skips or fails as Require does.
func RequireCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	c := &Cluster{}
	for range n {
		c.Nodes = append(c.Nodes, RequireWith(tb, Options{Config: []string{
			"cluster-enabled", "yes", "cluster-config-file", "nodes-" + strconv.Itoa(len(c.Nodes)) + ".conf",
			"cluster-node-timeout", "2000"}}))
	}
	if err := c.form(context.Background(), n); err != nil {
		tb.Fatal(err)
	}
	return c
}

// form gives each node its share of the slots, introduces them to each
// other and waits until all agree the cluster is ok.
func (c *Cluster) form(ctx context.Context, n int) error {
	per := 16384 / n
	for i, node := range c.Nodes {
		from, to := i*per, (i+1)*per-1
		if i == n-1 {
			to = 16383
		}
		if _, err := node.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(from), strconv.Itoa(to)); err != nil {
			return fmt.Errorf("redistest: node %s: CLUSTER ADDSLOTSRANGE: %w", node.Addr(), err)
		}
		if i > 0 {
			if _, err := node.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(c.Nodes[0].port)); err != nil {
				return fmt.Errorf("redistest: node %s: CLUSTER MEET: %w", node.Addr(), err)
			}
		}
	}
	deadline := time.Now().Add(StartTimeout)
	for _, node := range c.Nodes {
		for {
			info, err := node.Do(ctx, "CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("redistest: cluster not ok within %v (node %s: %q, %v)", StartTimeout, node.Addr(), info, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}
