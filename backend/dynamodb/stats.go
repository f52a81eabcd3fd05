package dynamodb

import (
	"sync"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluice-rl/sluice/backend"
)

// Stats are the running totals of a Backend, for metrics and benchmarks:
// how many DynamoDB calls each decision costs and what they consume.
// Capacity is counted in thousandths of a unit, so half units add up.
type Stats struct {
	CacheHits, CacheMisses atomic.Uint64
	// ConditionRetries counts writes that lost a race (condition failed or
	// transaction conflict) and were recomputed.
	ConditionRetries atomic.Uint64
	// LocalAnswers counts decisions answered with no DynamoDB call of
	// their own: admissions paid from a lease, and denials and checks
	// answered from the last state this replica saw of the bucket (and
	// its lease) within the staleness bound.
	LocalAnswers atomic.Uint64
	// Coalesced counts decisions whose tokens were written by a write
	// another decision of the same batch made.
	Coalesced atomic.Uint64
	// Contended counts decisions denied because their write lost every
	// race on a bucket near its limit: other replicas took its last
	// tokens first.
	Contended atomic.Uint64
	// GuessesRight and GuessesWrong count first decisions made on a guess
	// of their limits while their records were read (Backend.Decide): the
	// records said the same, or said otherwise and the call was decided
	// again.
	GuessesRight, GuessesWrong atomic.Uint64
	// LeaseStats are the leases' totals (leases on): moved in and out,
	// dropped, held now, the writes that moved them, and the decisions
	// denied at their deadline without the table's answer
	// (Backend.deadlineDenial).
	backend.LeaseStats
	ReadMilliUnits  atomic.Uint64
	WriteMilliUnits atomic.Uint64

	mu     sync.Mutex
	calls  map[string]uint64
	errors map[string]uint64
}

func newStats() *Stats {
	return &Stats{calls: map[string]uint64{}, errors: map[string]uint64{}}
}

func (s *Stats) call(op string, err error) {
	s.mu.Lock()
	s.calls[op]++
	if err != nil {
		s.errors[op]++
	}
	s.mu.Unlock()
}

// consumedRead and consumedWrite add the capacity reported by a read or a
// write call (ReturnConsumedCapacity TOTAL reports CapacityUnits only).
func (s *Stats) consumedRead(cc ...*types.ConsumedCapacity) {
	s.ReadMilliUnits.Add(milliUnits(cc))
}

func (s *Stats) consumedWrite(cc ...*types.ConsumedCapacity) {
	s.WriteMilliUnits.Add(milliUnits(cc))
}

func milliUnits(cc []*types.ConsumedCapacity) uint64 {
	var total float64
	for _, c := range cc {
		if c != nil && c.CapacityUnits != nil {
			total += *c.CapacityUnits
		}
	}
	return uint64(total*1000 + 0.5)
}

// Calls returns the number of calls and of failed calls per DynamoDB
// operation.
func (s *Stats) Calls() (calls, errors map[string]uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	calls, errors = make(map[string]uint64, len(s.calls)), make(map[string]uint64, len(s.errors))
	for k, v := range s.calls {
		calls[k] = v
	}
	for k, v := range s.errors {
		errors[k] = v
	}
	return calls, errors
}

// each adapts the capacity list of a batch or transaction answer.
func each(cc []types.ConsumedCapacity) []*types.ConsumedCapacity {
	out := make([]*types.ConsumedCapacity, len(cc))
	for i := range cc {
		out[i] = &cc[i]
	}
	return out
}

// ConfigCacheLen is how many buckets' config records the cache holds.
func (b *Backend) ConfigCacheLen() int { return b.records.cache.Len() }
