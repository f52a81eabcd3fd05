package telemetry

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go"

	"github.com/sluice-rl/sluice/admission"
	sluiceddb "github.com/sluice-rl/sluice/backend/dynamodb"
)

// failingAPI answers each DynamoDB call the way the test needs; the
// decorator under test only sees results.
type failingAPI struct{ sluiceddb.API }

func (failingAPI) UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	return nil, &smithy.GenericAPIError{Code: "ThrottlingException", Message: "slow down for entity secret-key"}
}

func (failingAPI) GetItem(ctx context.Context, _ *dynamodb.GetItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (failingAPI) PutItem(context.Context, *dynamodb.PutItemInput, ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	return &dynamodb.PutItemOutput{}, nil
}

func metricsText(t *testing.T, tel *Telemetry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	return string(body)
}

// Each DynamoDB call is timed under its operation, and a failure counted
// by its kind, never by its message.
func TestDynamoDBCallsAreTimedAndFailuresCountedByKind(t *testing.T) {
	tel, err := New(t.Context(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	api := tel.DynamoDB(failingAPI{})
	for range 2 {
		if _, err := api.UpdateItem(t.Context(), &dynamodb.UpdateItemInput{}); err == nil {
			t.Fatal("the error was lost")
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
	defer cancel()
	if _, err := api.GetItem(ctx, &dynamodb.GetItemInput{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("GetItem: %v", err)
	}
	if _, err := api.PutItem(t.Context(), &dynamodb.PutItemInput{}); err != nil {
		t.Fatal(err)
	}
	text := metricsText(t, tel)
	for _, want := range []string{
		`sluice_backend_call_errors_total{backend="dynamodb",kind="ThrottlingException",operation="UpdateItem"} 2`,
		`sluice_backend_call_errors_total{backend="dynamodb",kind="timeout",operation="GetItem"} 1`,
		`sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="UpdateItem"} 2`,
		`sluice_backend_call_duration_seconds_count{backend="dynamodb",operation="PutItem"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if regexp.MustCompile(`sluice_backend_call_errors_total\{[^}]*operation="PutItem"`).MatchString(text) {
		t.Error("a successful call was counted as an error")
	}
	if strings.Contains(text, "secret-key") {
		t.Error("an error message reached a label")
	}
}

func TestNewRefusesBadSampling(t *testing.T) {
	for _, f := range []float64{-0.1, 1.5} {
		if _, err := New(t.Context(), Options{TraceSampling: f}); err == nil {
			t.Errorf("TraceSampling %v accepted", f)
		}
	}
}

// Admission control shows on /metrics as what its stats say when scraped.
func TestAdmissionMetrics(t *testing.T) {
	tel, err := New(t.Context(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	st := admission.Stats{InFlight: 7, Queued: 3, ShedQueueFull: 11, ShedDeadline: 2}
	if err := tel.ObserveAdmission(func() admission.Stats { return st }); err != nil {
		t.Fatal(err)
	}
	text := metricsText(t, tel)
	for _, want := range []string{
		`sluice_grpc_shed_total{reason="queue_full"} 11`,
		`sluice_grpc_shed_total{reason="deadline"} 2`,
		`sluice_grpc_calls_in_flight 7`,
		`sluice_grpc_calls_queued 3`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, text)
		}
	}
}
