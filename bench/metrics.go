package bench

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The series of Sluice's /metrics a run reads, named as the Prometheus
// text format has them (docs/metrics.md).
const (
	// MetricBackendCalls is the histogram of backend calls, labelled
	// backend and operation; its _count counts them.
	MetricBackendCalls = "sluice_backend_call_duration_seconds"
	// MetricBackendErrors counts failed backend calls by backend,
	// operation and kind.
	MetricBackendErrors = "sluice_backend_call_errors_total"
	MetricReadUnits     = "sluice_dynamodb_read_capacity_units_total"
	MetricWriteUnits    = "sluice_dynamodb_write_capacity_units_total"
	MetricRetries       = "sluice_dynamodb_condition_retries_total"
	// MetricLocalAnswers counts decisions a replica answered from the
	// bucket state it last saw, without a DynamoDB call.
	MetricLocalAnswers = "sluice_dynamodb_local_answers_total"
	// MetricCoalesced counts decisions whose tokens another decision's
	// write carried: decisions that shared one UpdateItem.
	MetricCoalesced = "sluice_dynamodb_coalesced_decisions_total"
	// MetricLeaseWrites counts the bucket writes that granted lease
	// tokens or gave them back: a decision's write that also took a
	// lease, and the renewals and returns made in the background.
	MetricLeaseWrites = "sluice_dynamodb_lease_writes_total"
	// MetricContended counts calls denied because their write lost
	// every race near the bucket's limit.
	MetricContended = "sluice_dynamodb_contended_denials_total"
	// MetricCacheMisses counts the limit lookups that read the store
	// (DynamoDB or Redis) rather than the config cache.
	MetricCacheMisses = "sluice_config_cache_misses_total"
	// MetricRequests is the histogram of ShouldRateLimit calls as the
	// replica timed them, from the call's arrival to its answer.
	MetricRequests = "sluice_request_duration_seconds"
)

// slowBounds are the handling times a run counts the calls above
// (Usage.SlowAnswers), by the names it reports them under: 25 ms is half
// of the example envoy.yaml's 50 ms timeout; a call handled in over 50 ms
// was late before it left the replica. Each is a bucket bound of
// MetricRequests.
func slowBounds() map[string]float64 { return map[string]float64{"25ms": 0.025, "50ms": 0.05} }

// Operation label values of MetricBackendCalls.
const (
	OpDecide = "decide"
	// DynamoDB's write calls: what consumes write capacity.
	OpUpdateItem         = "UpdateItem"
	OpPutItem            = "PutItem"
	OpTransactWriteItems = "TransactWriteItems"
	// Redis's round trips: a decision's script, and a pipelined batch
	// of config-record reads.
	OpEvalSHA = "EVALSHA"
	OpHGetAll = "HGETALL"
)

// Backend label values.
const (
	// BackendDynamoDB is the backend label value of DynamoDB's API calls.
	BackendDynamoDB = "dynamodb"
	// BackendRedis is the backend label value of Redis's round trips.
	BackendRedis = "redis"
)

// isCounted reports whether a run reports the total of the counter
// family name.
func isCounted(name string) bool {
	switch name {
	case MetricReadUnits, MetricWriteUnits, MetricRetries, MetricLocalAnswers, MetricCoalesced, MetricLeaseWrites, MetricContended,
		MetricCacheMisses:
		return true
	}
	return false
}

// Call is a backend and operation: one series of MetricBackendCalls.
type Call struct{ Backend, Operation string }

// Failure is a backend and a kind of error (an AWS error code, timeout,
// ...): failed calls of MetricBackendErrors to the backend's store (any
// operation but "decide").
type Failure struct{ Backend, Kind string }

// Snapshot is what a run reads of one or more /metrics pages, summed over
// the pages: counters only, so that the difference of two snapshots is
// what happened in between.
type Snapshot struct {
	// Calls counts backend calls by backend and operation.
	Calls map[Call]float64
	// Errors counts failed DynamoDB calls by kind (an AWS error code,
	// timeout, ...); Failures every backend's failed calls to its store.
	Errors   map[string]float64
	Failures map[Failure]float64
	// Counters holds the totals of the counters a run reports
	// (MetricReadUnits ... MetricContended) that the pages served; one
	// that none served is missing, not zero.
	Counters map[string]float64
	// Handled counts the ShouldRateLimit calls of MetricRequests by the
	// upper bound of their bucket in seconds (cumulative, as Prometheus
	// counts them; +Inf is all of them), summed over domains and codes.
	Handled map[float64]float64
}

// ParseMetrics reads one page in the Prometheus text format.
func ParseMetrics(r io.Reader) (Snapshot, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return Snapshot{}, fmt.Errorf("parse Prometheus text: %w", err)
	}
	s := newSnapshot()
	for name, f := range families {
		for _, m := range f.GetMetric() {
			labels := make(map[string]string, len(m.GetLabel()))
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch {
			case name == MetricBackendCalls && m.GetHistogram() != nil:
				s.Calls[Call{labels["backend"], labels["operation"]}] += float64(m.GetHistogram().GetSampleCount())
			case name == MetricRequests && m.GetHistogram() != nil:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					// The count is all of them; a page may list +Inf too.
					if !math.IsInf(b.GetUpperBound(), 1) {
						s.Handled[b.GetUpperBound()] += float64(b.GetCumulativeCount())
					}
				}
				s.Handled[math.Inf(1)] += float64(h.GetSampleCount())
			case name == MetricBackendErrors:
				n := m.GetCounter().GetValue()
				// A failed store call usually fails its decision too:
				// Failures counts the store's calls only.
				if labels["operation"] != OpDecide {
					s.Failures[Failure{labels["backend"], labels["kind"]}] += n
				}
				if labels["backend"] == BackendDynamoDB {
					s.Errors[labels["kind"]] += n
				}
			case isCounted(name):
				// Untyped too: a page without TYPE lines is still the
				// text format.
				s.Counters[name] += m.GetCounter().GetValue() + m.GetUntyped().GetValue()
			}
		}
	}
	return s, nil
}

func newSnapshot() Snapshot {
	return Snapshot{Calls: map[Call]float64{}, Errors: map[string]float64{}, Failures: map[Failure]float64{},
		Counters: map[string]float64{}, Handled: map[float64]float64{}}
}

// add sums o into s.
func (s Snapshot) add(o Snapshot) {
	for k, v := range o.Calls {
		s.Calls[k] += v
	}
	for k, v := range o.Errors {
		s.Errors[k] += v
	}
	for k, v := range o.Failures {
		s.Failures[k] += v
	}
	for k, v := range o.Counters {
		s.Counters[k] += v
	}
	for k, v := range o.Handled {
		s.Handled[k] += v
	}
}

// Sub returns what the counters moved by from before to s. A series
// missing from before counts from zero there: Sluice's labelled
// counters appear with their first count. A counter missing from s
// stays missing.
func (s Snapshot) Sub(before Snapshot) Snapshot {
	d := newSnapshot()
	for k, v := range s.Calls {
		if delta := v - before.Calls[k]; delta != 0 {
			d.Calls[k] = delta
		}
	}
	for k, v := range s.Errors {
		if delta := v - before.Errors[k]; delta != 0 {
			d.Errors[k] = delta
		}
	}
	for k, v := range s.Failures {
		if delta := v - before.Failures[k]; delta != 0 {
			d.Failures[k] = delta
		}
	}
	for k, v := range s.Counters {
		d.Counters[k] = v - before.Counters[k]
	}
	for k, v := range s.Handled {
		d.Handled[k] = v - before.Handled[k]
	}
	return d
}

// Usage is what the backend did over a run, summed over the replicas,
// and what that comes to per decision. A nil pointer is a number that
// does not exist: its counter was not served, or its denominator is zero.
type Usage struct {
	// Pages is the number of /metrics pages summed.
	Pages int `json:"pages"`
	// Decisions counts backend decisions (operation "decide"), which is
	// one per answered call that matched a rule.
	Decisions float64 `json:"backend_decisions"`
	// Backend is the backend label of those decisions ("memory",
	// "dynamodb", "redis"; several joined by "+", in name order), or ""
	// when there were none.
	Backend string `json:"backend"`
	// BackendCalls counts the calls the backend made to its store, every
	// operation but "decide", in all and by operation: DynamoDB's API
	// calls (the DynamoDB fields below break them down further), and
	// Redis's round trips (EVALSHA, a decision's script; HGETALL, one
	// pipelined batch of config reads). BackendErrors counts the failed
	// ones by kind.
	BackendCalls      float64            `json:"backend_calls"`
	BackendCallsByOp  map[string]float64 `json:"backend_calls_by_operation"`
	BackendErrors     map[string]float64 `json:"backend_errors_by_kind"`
	ConfigCacheMisses *float64           `json:"config_cache_misses"`
	// BackendCallsPerDecision is BackendCalls over Decisions: on Redis,
	// its round trips per decision.
	BackendCallsPerDecision *float64 `json:"backend_calls_per_decision"`
	// DynamoDBCalls counts DynamoDB API calls, in all and by operation.
	DynamoDBCalls     float64            `json:"dynamodb_calls"`
	DynamoDBCallsByOp map[string]float64 `json:"dynamodb_calls_by_operation"`
	// DynamoDBErrors counts the failed ones by kind; a lost write race
	// is ConditionalCheckFailedException.
	DynamoDBErrors map[string]float64 `json:"dynamodb_errors_by_kind"`
	// Writes counts UpdateItem, PutItem and TransactWriteItems calls,
	// failed ones included: a failed conditional write still costs
	// capacity.
	Writes             float64  `json:"dynamodb_writes"`
	ReadUnits          *float64 `json:"read_capacity_units"`
	WriteUnits         *float64 `json:"write_capacity_units"`
	ConditionRetries   *float64 `json:"condition_retries"`
	LocalAnswers       *float64 `json:"local_answers"`
	CoalescedDecisions *float64 `json:"coalesced_decisions"`
	// LeaseWrites counts the writes that granted or gave back lease
	// tokens (part of Writes); ContendedDenials the calls denied after
	// losing every write race near the limit.
	LeaseWrites      *float64 `json:"lease_writes"`
	ContendedDenials *float64 `json:"contended_denials"`

	CallsPerDecision *float64 `json:"dynamodb_calls_per_decision"`
	RCUPerDecision   *float64 `json:"rcu_per_decision"`
	WCUPerDecision   *float64 `json:"wcu_per_decision"`
	// WritesPerAllowed is Writes over the calls answered OK, as the
	// client counted them.
	WritesPerAllowed *float64 `json:"writes_per_allowed_decision"`
	// LocalDenialShare is LocalAnswers over the calls answered
	// OVER_LIMIT, as the client counted them: the share of denials that
	// cost no DynamoDB call.
	LocalDenialShare *float64 `json:"local_denial_share"`
	// CoalescedShare is CoalescedDecisions over Decisions.
	CoalescedShare *float64 `json:"coalesced_share"`
	// SlowAnswers counts the ShouldRateLimit calls the replicas took
	// longer than 25 ms and 50 ms to handle, by its name; nil when no
	// page served MetricRequests. Set beside the calls the client saw
	// past their deadline, it tells the replicas' lateness from the
	// machine's: the rest of a call's time is spent in the network, the
	// transport and waiting for a core.
	SlowAnswers map[string]float64 `json:"answered_slower_than,omitempty"`
}

// Usage derives a run's usage from s, the difference of the snapshots
// around it, and the numbers of calls the client saw answered OK and
// OVER_LIMIT.
func (s Snapshot) Usage(ok, overLimit uint64) Usage {
	u := Usage{DynamoDBCallsByOp: map[string]float64{}, DynamoDBErrors: map[string]float64{},
		BackendCallsByOp: map[string]float64{}, BackendErrors: map[string]float64{}}
	maps.Copy(u.DynamoDBErrors, s.Errors)
	for f, n := range s.Failures {
		u.BackendErrors[f.Kind] += n
	}
	backends := map[string]bool{}
	for c, n := range s.Calls {
		if c.Operation == OpDecide {
			u.Decisions += n
			backends[c.Backend] = true
			continue
		}
		u.BackendCalls += n
		u.BackendCallsByOp[c.Operation] += n
		if c.Backend == BackendDynamoDB {
			u.DynamoDBCalls += n
			u.DynamoDBCallsByOp[c.Operation] += n
			switch c.Operation {
			case OpUpdateItem, OpPutItem, OpTransactWriteItems:
				u.Writes += n
			}
		}
	}
	u.Backend = strings.Join(slices.Sorted(maps.Keys(backends)), "+")
	counter := func(name string) *float64 {
		if v, ok := s.Counters[name]; ok {
			return &v
		}
		return nil
	}
	u.ReadUnits = counter(MetricReadUnits)
	u.WriteUnits = counter(MetricWriteUnits)
	u.ConditionRetries = counter(MetricRetries)
	u.LocalAnswers = counter(MetricLocalAnswers)
	u.CoalescedDecisions = counter(MetricCoalesced)
	u.LeaseWrites = counter(MetricLeaseWrites)
	u.ContendedDenials = counter(MetricContended)
	u.ConfigCacheMisses = counter(MetricCacheMisses)

	u.CallsPerDecision = ratio(&u.DynamoDBCalls, u.Decisions)
	u.RCUPerDecision = ratio(u.ReadUnits, u.Decisions)
	u.WCUPerDecision = ratio(u.WriteUnits, u.Decisions)
	u.WritesPerAllowed = ratio(&u.Writes, float64(ok))
	u.LocalDenialShare = ratio(u.LocalAnswers, float64(overLimit))
	u.CoalescedShare = ratio(u.CoalescedDecisions, u.Decisions)
	u.BackendCallsPerDecision = ratio(&u.BackendCalls, u.Decisions)
	if all, ok := s.Handled[math.Inf(1)]; ok {
		u.SlowAnswers = map[string]float64{}
		for name, bound := range slowBounds() {
			if within, ok := s.Handled[bound]; ok {
				u.SlowAnswers[name] = all - within
			}
		}
	}
	return u
}

// ratio is num/den, or nil when num is nil or den is zero.
func ratio(num *float64, den float64) *float64 {
	if num == nil || den == 0 {
		return nil
	}
	r := *num / den
	return &r
}

// scraper reads the /metrics pages of a fleet.
type scraper struct {
	urls   []string
	client *http.Client
}

// scrapeTimeout bounds one page's scrape: a page is a few kilobytes from
// loopback.
const scrapeTimeout = 10 * time.Second

func newScraper(urls []string) *scraper {
	return &scraper{urls: urls, client: &http.Client{Timeout: scrapeTimeout}}
}

// scrape reads every page, all at once so that the pages of a fleet are
// read as close together in time as they can be, and sums them.
func (sc *scraper) scrape(ctx context.Context) (Snapshot, error) {
	pages := make([]Snapshot, len(sc.urls))
	errs := make([]error, len(sc.urls))
	var wg sync.WaitGroup
	for i, u := range sc.urls {
		wg.Go(func() { pages[i], errs[i] = sc.page(ctx, u) })
	}
	wg.Wait()
	sum := newSnapshot()
	for i, s := range pages {
		if errs[i] != nil {
			return Snapshot{}, errs[i]
		}
		sum.add(s)
	}
	return sum, nil
}

func (sc *scraper) page(ctx context.Context, u string) (Snapshot, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Snapshot{}, fmt.Errorf("metrics %s: %w", u, err)
	}
	// The classic text format, not OpenMetrics or protobuf, whatever the
	// server would prefer.
	req.Header.Set("Accept", string(expfmt.FmtText))
	resp, err := sc.client.Do(req)
	if err != nil {
		return Snapshot{}, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Snapshot{}, fmt.Errorf("metrics %s: %s", u, resp.Status)
	}
	s, err := ParseMetrics(resp.Body)
	if err != nil {
		return Snapshot{}, fmt.Errorf("metrics %s: %w", u, err)
	}
	return s, nil
}

// checkMetricsURL accepts an http URL on a loopback host.
func checkMetricsURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("metrics URL: %w", err)
	}
	if u.Scheme != "http" || u.Host == "" {
		return fmt.Errorf("metrics URL %q: want http://host:port/metrics", s)
	}
	if !isLoopback(u.Hostname()) {
		return fmt.Errorf("metrics URL %q: only loopback hosts (127.0.0.0/8, ::1, localhost) are allowed", s)
	}
	return nil
}
