package dynamodb

import (
	"testing"

	"github.com/sluice-rl/sluice/backend/backendtest"
)

// Charges after the response land beyond what is left, into debt, on
// DynamoDB Local (backendtest.ChargesLandInDebt): one conditional write
// each without leases, and with leases, where a lease that cannot pay a
// charge sends it to the table, whose write takes the rest of the limit
// below zero.
func TestChargesLandInDebt(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		name string
		opts Options
	}{
		{"without leases", Options{KeyPrefix: "nolease", LeaseHorizon: -1}},
		{"with leases", Options{KeyPrefix: "lease"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			backendtest.ChargesLandInDebt(t, e.replica(t, c.opts), e.admin(t, c.opts.KeyPrefix).GetBucket)
		})
	}
}
