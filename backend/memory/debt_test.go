package memory

import (
	"testing"

	"github.com/sluice-rl/sluice/backend/backendtest"
)

func TestChargesLandInDebt(t *testing.T) {
	b, _ := newTestBackend(t, Options{})
	backendtest.ChargesLandInDebt(t, b, nil)
}
