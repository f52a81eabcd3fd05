package redis

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend/backendtest"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
)

// Charges after the response land beyond what is left, into debt, on a
// real Redis (backendtest.ChargesLandInDebt): decided by the script
// alone, and with leases, where a lease that cannot pay a charge sends
// it whole to the shared bucket.
func TestChargesLandInDebt(t *testing.T) {
	srv := redistest.Require(t)
	for _, c := range []struct {
		name string
		opts Options
	}{
		{"without leases", Options{KeyPrefix: "nolease", LeaseHorizon: -1}},
		{"with leases", Options{KeyPrefix: "lease", LeaseHorizon: 30 * time.Second}},
	} {
		t.Run(c.name, func(t *testing.T) {
			client := newClient(t, srv)
			backendtest.ChargesLandInDebt(t, newBackend(t, client, c.opts), newAdmin(t, client, c.opts.KeyPrefix, nil).GetBucket)
		})
	}
}
