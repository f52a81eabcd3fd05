package bench

import (
	"strings"
	"testing"
)

// A replica's page after some DynamoDB work, in the shape Sluice serves
// (HELP lines and buckets trimmed; a histogram needs no bucket lines to
// parse).
const pageBefore = `# TYPE sluice_backend_call_duration_seconds histogram
sluice_backend_call_duration_seconds_sum{backend="dynamodb",operation="decide"} 1.5
sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="decide"} 100
sluice_backend_call_duration_seconds_sum{backend="dynamodb",operation="UpdateItem"} 1
sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="UpdateItem"} 90
sluice_backend_call_duration_seconds_sum{backend="dynamodb",operation="DescribeTable"} 0.02
sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="DescribeTable"} 1
# TYPE sluice_dynamodb_read_capacity_units_total counter
sluice_dynamodb_read_capacity_units_total 2.5
# TYPE sluice_dynamodb_write_capacity_units_total counter
sluice_dynamodb_write_capacity_units_total 90
# TYPE sluice_dynamodb_condition_retries_total counter
sluice_dynamodb_condition_retries_total 3
# TYPE sluice_dynamodb_local_answers_total counter
sluice_dynamodb_local_answers_total 10
# TYPE sluice_decisions_total counter
sluice_decisions_total{code="ok",domain="bench",rule="bench/bench_key"} 100
# TYPE sluice_request_duration_seconds histogram
sluice_request_duration_seconds_bucket{domain="bench",grpc_code="OK",le="0.01"} 95
sluice_request_duration_seconds_bucket{domain="bench",grpc_code="OK",le="0.025"} 98
sluice_request_duration_seconds_bucket{domain="bench",grpc_code="OK",le="0.05"} 99
sluice_request_duration_seconds_bucket{domain="bench",grpc_code="OK",le="+Inf"} 100
sluice_request_duration_seconds_sum{domain="bench",grpc_code="OK"} 0.3
sluice_request_duration_seconds_count{domain="bench",grpc_code="OK"} 100
`

// The same replica after the run. Series that appear only now (PutItem,
// the errors) count from zero.
const pageAfter = `# HELP sluice_backend_call_duration_seconds Backend calls.
# TYPE sluice_backend_call_duration_seconds histogram
sluice_backend_call_duration_seconds_bucket{backend="dynamodb",operation="decide",le="0.001"} 300
sluice_backend_call_duration_seconds_bucket{backend="dynamodb",operation="decide",le="+Inf"} 700
sluice_backend_call_duration_seconds_sum{backend="dynamodb",operation="decide"} 9
sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="decide"} 700
sluice_backend_call_duration_seconds_sum{backend="dynamodb",operation="UpdateItem"} 4
sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="UpdateItem"} 390
sluice_backend_call_duration_seconds_sum{backend="dynamodb",operation="PutItem"} 0.5
sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="PutItem"} 50
sluice_backend_call_duration_seconds_sum{backend="dynamodb",operation="BatchGetItem"} 0.1
sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="BatchGetItem"} 15
sluice_backend_call_duration_seconds_sum{backend="dynamodb",operation="DescribeTable"} 0.02
sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="DescribeTable"} 1
# TYPE sluice_backend_call_errors_total counter
sluice_backend_call_errors_total{backend="dynamodb",kind="ConditionalCheckFailedException",operation="UpdateItem"} 7
# TYPE sluice_dynamodb_read_capacity_units_total counter
sluice_dynamodb_read_capacity_units_total 10
# TYPE sluice_dynamodb_write_capacity_units_total counter
sluice_dynamodb_write_capacity_units_total 440
# TYPE sluice_dynamodb_condition_retries_total counter
sluice_dynamodb_condition_retries_total 10
# TYPE sluice_dynamodb_local_answers_total counter
sluice_dynamodb_local_answers_total 208
# TYPE sluice_decisions_total counter
sluice_decisions_total{code="ok",domain="bench",rule="bench/bench_key"} 700
# TYPE sluice_request_duration_seconds histogram
sluice_request_duration_seconds_bucket{domain="bench",grpc_code="OK",le="0.01"} 680
sluice_request_duration_seconds_bucket{domain="bench",grpc_code="OK",le="0.025"} 690
sluice_request_duration_seconds_bucket{domain="bench",grpc_code="OK",le="0.05"} 695
sluice_request_duration_seconds_bucket{domain="bench",grpc_code="OK",le="+Inf"} 700
sluice_request_duration_seconds_sum{domain="bench",grpc_code="OK"} 2
sluice_request_duration_seconds_count{domain="bench",grpc_code="OK"} 700
sluice_request_duration_seconds_bucket{domain="bench",grpc_code="Unavailable",le="0.01"} 0
sluice_request_duration_seconds_bucket{domain="bench",grpc_code="Unavailable",le="0.025"} 0
sluice_request_duration_seconds_bucket{domain="bench",grpc_code="Unavailable",le="0.05"} 1
sluice_request_duration_seconds_bucket{domain="bench",grpc_code="Unavailable",le="+Inf"} 4
sluice_request_duration_seconds_sum{domain="bench",grpc_code="Unavailable"} 0.5
sluice_request_duration_seconds_count{domain="bench",grpc_code="Unavailable"} 4
`

// A second replica, up only for the run: everything from zero. It serves
// the coalescing counter, the first does not.
const pageOther = `# TYPE sluice_backend_call_duration_seconds histogram
sluice_backend_call_duration_seconds_sum{backend="dynamodb",operation="decide"} 4
sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="decide"} 400
sluice_backend_call_duration_seconds_sum{backend="dynamodb",operation="UpdateItem"} 2
sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="UpdateItem"} 100
sluice_backend_call_duration_seconds_sum{backend="dynamodb",operation="TransactWriteItems"} 1
sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="TransactWriteItems"} 25
sluice_backend_call_duration_seconds_sum{backend="dynamodb",operation="GetItem"} 0.1
sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="GetItem"} 10
# TYPE sluice_dynamodb_read_capacity_units_total counter
sluice_dynamodb_read_capacity_units_total 5
# TYPE sluice_dynamodb_write_capacity_units_total counter
sluice_dynamodb_write_capacity_units_total 150
# TYPE sluice_dynamodb_local_answers_total counter
sluice_dynamodb_local_answers_total 0
# TYPE sluice_dynamodb_coalesced_decisions_total counter
sluice_dynamodb_coalesced_decisions_total 250
# TYPE sluice_dynamodb_lease_writes_total counter
sluice_dynamodb_lease_writes_total 40
# TYPE sluice_dynamodb_contended_denials_total counter
sluice_dynamodb_contended_denials_total 3
`

func parse(t *testing.T, page string) Snapshot {
	t.Helper()
	s, err := ParseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestUsage derives a run's numbers from two replicas' pages before and
// after it, and checks each against the sums worked out by hand.
func TestUsage(t *testing.T) {
	before := parse(t, pageBefore)
	after := parse(t, pageAfter)
	after.add(parse(t, pageOther))
	// The client saw 950 OK and 200 OVER_LIMIT answers.
	u := after.Sub(before).Usage(950, 200)

	// decide: 700-100 + 400 = 1000. DynamoDB calls: UpdateItem 300+100,
	// PutItem 50, TransactWriteItems 25, BatchGetItem 15, GetItem 10 =
	// 500, of which 475 writes.
	want := map[string]float64{"UpdateItem": 400, "PutItem": 50, "TransactWriteItems": 25, "BatchGetItem": 15, "GetItem": 10}
	if u.Decisions != 1000 || u.DynamoDBCalls != 500 || u.Writes != 475 {
		t.Errorf("decisions %v, calls %v, writes %v; want 1000, 500, 475", u.Decisions, u.DynamoDBCalls, u.Writes)
	}
	if len(u.DynamoDBCallsByOp) != len(want) {
		t.Errorf("calls by operation %v, want %v", u.DynamoDBCallsByOp, want)
	}
	for op, n := range want {
		if u.DynamoDBCallsByOp[op] != n {
			t.Errorf("%s calls %v, want %v", op, u.DynamoDBCallsByOp[op], n)
		}
	}
	if len(u.DynamoDBErrors) != 1 || u.DynamoDBErrors["ConditionalCheckFailedException"] != 7 {
		t.Errorf("errors %v, want ConditionalCheckFailedException 7", u.DynamoDBErrors)
	}
	// The backend's calls in general are the DynamoDB calls here.
	if u.Backend != BackendDynamoDB || u.BackendCalls != 500 || len(u.BackendCallsByOp) != len(want) ||
		u.BackendErrors["ConditionalCheckFailedException"] != 7 || u.BackendCallsPerDecision == nil || *u.BackendCallsPerDecision != 0.5 {
		t.Errorf("backend %q, calls %v by operation %v, errors %v, per decision %v; want dynamodb, 500, 0.5 per decision",
			u.Backend, u.BackendCalls, u.BackendCallsByOp, u.BackendErrors, u.BackendCallsPerDecision)
	}
	for _, c := range []struct {
		name string
		got  *float64
		want float64
	}{
		{"read units", u.ReadUnits, 12.5},  // 10-2.5 + 5
		{"write units", u.WriteUnits, 500}, // 440-90 + 150
		{"condition retries", u.ConditionRetries, 7},
		{"local answers", u.LocalAnswers, 198},   // 208-10 + 0
		{"coalesced", u.CoalescedDecisions, 250}, // the second page only
		{"lease writes", u.LeaseWrites, 40},
		{"contended denials", u.ContendedDenials, 3},
		{"calls per decision", u.CallsPerDecision, 0.5},
		{"RCU per decision", u.RCUPerDecision, 0.0125},
		{"WCU per decision", u.WCUPerDecision, 0.5},
		{"writes per allowed", u.WritesPerAllowed, 0.5},  // 475 / 950
		{"local denial share", u.LocalDenialShare, 0.99}, // 198 / 200
		{"coalesced share", u.CoalescedShare, 0.25},
	} {
		if c.got == nil {
			t.Errorf("%s: n/a, want %v", c.name, c.want)
		} else if *c.got != c.want {
			t.Errorf("%s: %v, want %v", c.name, *c.got, c.want)
		}
	}
	// Handled over 25 ms: OK (700-690) - (100-98) = 8, Unavailable 4;
	// over 50 ms: (700-695) - (100-99) = 4, and 3. The second page
	// serves none.
	if got := u.SlowAnswers; len(got) != 2 || got["25ms"] != 12 || got["50ms"] != 7 {
		t.Errorf("handled slower than: %v, want 25ms 12, 50ms 7", got)
	}
}

// TestUsageMissing checks that counters no page serves, and ratios over
// nothing, are n/a rather than zero.
func TestUsageMissing(t *testing.T) {
	page := `# TYPE sluice_backend_call_duration_seconds histogram
sluice_backend_call_duration_seconds_sum{backend="memory",operation="decide"} 1
sluice_backend_call_duration_seconds_count{backend="memory",operation="decide"} 40
`
	u := parse(t, page).Sub(Snapshot{}).Usage(40, 0)
	if u.Decisions != 40 || u.DynamoDBCalls != 0 || u.Writes != 0 || u.Backend != "memory" || u.BackendCalls != 0 {
		t.Errorf("decisions %v, calls %v, writes %v, backend %q with %v calls; want 40, 0, 0, memory with 0",
			u.Decisions, u.DynamoDBCalls, u.Writes, u.Backend, u.BackendCalls)
	}
	if u.CallsPerDecision == nil || *u.CallsPerDecision != 0 || u.WritesPerAllowed == nil || *u.WritesPerAllowed != 0 {
		t.Errorf("calls per decision %v, writes per allowed %v; want 0 and 0", u.CallsPerDecision, u.WritesPerAllowed)
	}
	for name, v := range map[string]*float64{
		"read units": u.ReadUnits, "write units": u.WriteUnits, "retries": u.ConditionRetries,
		"local answers": u.LocalAnswers, "coalesced": u.CoalescedDecisions,
		"lease writes": u.LeaseWrites, "contended denials": u.ContendedDenials,
		"RCU per decision": u.RCUPerDecision, "WCU per decision": u.WCUPerDecision,
		"local denial share": u.LocalDenialShare, "coalesced share": u.CoalescedShare,
		"config cache misses": u.ConfigCacheMisses,
	} {
		if v != nil {
			t.Errorf("%s = %v, want n/a", name, *v)
		}
	}
	if u.SlowAnswers != nil {
		t.Errorf("handled slower than: %v, want none (no request histogram served)", u.SlowAnswers)
	}
	if r := (Snapshot{}).Usage(0, 0); r.CallsPerDecision != nil || r.WritesPerAllowed != nil {
		t.Errorf("ratios over zero decisions: %v, %v; want n/a", r.CallsPerDecision, r.WritesPerAllowed)
	}
}

// Two replicas on Redis, before and after a run: decisions, the round
// trips (EVALSHA, HGETALL), a failed script run and the config cache.
const (
	redisBefore = `# TYPE sluice_backend_call_duration_seconds histogram
sluice_backend_call_duration_seconds_count{backend="redis",operation="decide"} 100
sluice_backend_call_duration_seconds_sum{backend="redis",operation="decide"} 0.1
sluice_backend_call_duration_seconds_count{backend="redis",operation="EVALSHA"} 100
sluice_backend_call_duration_seconds_sum{backend="redis",operation="EVALSHA"} 0.05
sluice_backend_call_duration_seconds_count{backend="redis",operation="HGETALL"} 30
sluice_backend_call_duration_seconds_sum{backend="redis",operation="HGETALL"} 0.01
# TYPE sluice_config_cache_misses_total counter
sluice_config_cache_misses_total 40
`
	redisAfter = `# TYPE sluice_backend_call_duration_seconds histogram
sluice_backend_call_duration_seconds_count{backend="redis",operation="decide"} 1100
sluice_backend_call_duration_seconds_sum{backend="redis",operation="decide"} 1
sluice_backend_call_duration_seconds_count{backend="redis",operation="EVALSHA"} 1000
sluice_backend_call_duration_seconds_sum{backend="redis",operation="EVALSHA"} 0.5
sluice_backend_call_duration_seconds_count{backend="redis",operation="HGETALL"} 80
sluice_backend_call_duration_seconds_sum{backend="redis",operation="HGETALL"} 0.02
# TYPE sluice_backend_call_errors_total counter
sluice_backend_call_errors_total{backend="redis",kind="timeout",operation="EVALSHA"} 2
sluice_backend_call_errors_total{backend="redis",kind="timeout",operation="decide"} 2
# TYPE sluice_config_cache_misses_total counter
sluice_config_cache_misses_total 100
`
	redisOther = `# TYPE sluice_backend_call_duration_seconds histogram
sluice_backend_call_duration_seconds_count{backend="redis",operation="decide"} 1000
sluice_backend_call_duration_seconds_sum{backend="redis",operation="decide"} 1
sluice_backend_call_duration_seconds_count{backend="redis",operation="EVALSHA"} 1000
sluice_backend_call_duration_seconds_sum{backend="redis",operation="EVALSHA"} 0.5
sluice_backend_call_duration_seconds_count{backend="redis",operation="HGETALL"} 20
sluice_backend_call_duration_seconds_sum{backend="redis",operation="HGETALL"} 0.02
# TYPE sluice_config_cache_misses_total counter
sluice_config_cache_misses_total 20
`
)

// TestUsageRedis gives Redis round trips per decision as TestUsage gives
// DynamoDB calls: every operation but decide, over the decisions. A
// failed script run counts once, not again with its decision; the
// DynamoDB numbers stay empty.
func TestUsageRedis(t *testing.T) {
	after := parse(t, redisAfter)
	after.add(parse(t, redisOther))
	u := after.Sub(parse(t, redisBefore)).Usage(2000, 0)
	// decide 1000 + 1000; EVALSHA 900 + 1000, HGETALL 50 + 20.
	if u.Backend != BackendRedis || u.Decisions != 2000 || u.BackendCalls != 1970 ||
		u.BackendCallsByOp[OpEvalSHA] != 1900 || u.BackendCallsByOp[OpHGetAll] != 70 || len(u.BackendCallsByOp) != 2 {
		t.Errorf("backend %q, %v decisions, %v calls by operation %v; want redis, 2000, 1970 (EVALSHA 1900, HGETALL 70)",
			u.Backend, u.Decisions, u.BackendCalls, u.BackendCallsByOp)
	}
	if u.BackendCallsPerDecision == nil || *u.BackendCallsPerDecision != 0.985 {
		t.Errorf("round trips per decision %v, want 0.985", u.BackendCallsPerDecision)
	}
	if len(u.BackendErrors) != 1 || u.BackendErrors["timeout"] != 2 {
		t.Errorf("errors %v, want timeout 2 (the EVALSHA's, not its decision's)", u.BackendErrors)
	}
	if u.ConfigCacheMisses == nil || *u.ConfigCacheMisses != 80 {
		t.Errorf("config cache misses %v, want 80", u.ConfigCacheMisses)
	}
	if u.DynamoDBCalls != 0 || len(u.DynamoDBErrors) != 0 || u.Writes != 0 || u.ReadUnits != nil {
		t.Errorf("DynamoDB usage on Redis: %+v", u)
	}
}

func TestParseMetricsRejects(t *testing.T) {
	if _, err := ParseMetrics(strings.NewReader("sluice_x{a=\"b\" 1\n")); err == nil {
		t.Error("parsed a broken page")
	}
}

func TestCheckMetricsURL(t *testing.T) {
	for _, u := range []string{"http://127.0.0.1:8080/metrics", "http://localhost:9/metrics", "http://[::1]:80/metrics"} {
		if err := checkMetricsURL(u); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
	for _, u := range []string{"https://127.0.0.1:8080/metrics", "http://192.0.2.1:8080/metrics", "127.0.0.1:8080/metrics", "http:///metrics", "http://example.com/metrics"} {
		if err := checkMetricsURL(u); err == nil {
			t.Errorf("%s accepted", u)
		}
	}
}
