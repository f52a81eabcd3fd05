package dynamodb

import (
	"errors"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluice-rl/sluice/backend"
)

// observeWrite adds a bucket write that took d and ended with err to r.
// A write that lost its race went to the table and back like any other;
// one that failed for another reason (a timeout, a refused connection)
// says nothing of the distance and is left out.
func observeWrite(r *backend.RoundTrip, d time.Duration, err error) {
	var ccf *types.ConditionalCheckFailedException
	var tce *types.TransactionCanceledException
	if err != nil && !errors.As(err, &ccf) && !errors.As(err, &tce) {
		return
	}
	r.Observe(d)
}
