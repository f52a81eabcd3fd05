package telemetry

import (
	"context"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rl/sluice/backend"
	sluiceddb "github.com/sluice-rl/sluice/backend/dynamodb"
	"github.com/sluice-rl/sluice/ratelimit"
)

// call times one backend operation: a child span of the request's, a
// latency sample and, on failure, an error by kind.
func (t *Telemetry) call(ctx context.Context, backendName, op string, fn func(context.Context) error) error {
	span := trace.SpanFromContext(context.Background()) // does nothing: not tracing
	if t.tracers != nil {
		ctx, span = t.tracer.Start(ctx, backendName+"."+op, trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("sluice.backend", backendName)))
	}
	start := time.Now()
	err := fn(ctx)
	t.inst.backendDuration.Record(ctx, time.Since(start).Seconds(), t.set(attrKey{"backend", backendName, op, "", ""}, "backend", "operation").rec...)
	if err != nil {
		kind := ratelimit.ErrorKind(err)
		t.inst.backendErrors.Add(ctx, 1, t.set(attrKey{"backend_errors", backendName, op, kind, ""}, "backend", "operation", "kind").add...)
		span.SetStatus(codes.Error, kind)
	}
	span.End()
	return err
}

// Backend wraps be so that each decision is timed as operation "decide"
// of backend name.
func (t *Telemetry) Backend(name string, be backend.Backend) backend.Backend {
	return &timedBackend{t: t, name: name, be: be}
}

type timedBackend struct {
	t    *Telemetry
	name string
	be   backend.Backend
}

func (b *timedBackend) Decide(ctx context.Context, req *backend.Request) (d backend.Decision, err error) {
	err = b.t.call(ctx, b.name, "decide", func(ctx context.Context) error {
		d, err = b.be.Decide(ctx, req)
		return err
	})
	return d, err
}

// DynamoDB wraps api so that each DynamoDB call is timed as its API
// operation of backend "dynamodb", in a span of its own.
func (t *Telemetry) DynamoDB(api sluiceddb.API) sluiceddb.API { return &timedDynamoDB{t: t, api: api} }

type timedDynamoDB struct {
	t   *Telemetry
	api sluiceddb.API
}

// timed runs one DynamoDB call through Telemetry.call.
func timed[In, Out any](ctx context.Context, d *timedDynamoDB, op string, in In, opts []func(*dynamodb.Options),
	fn func(context.Context, In, ...func(*dynamodb.Options)) (Out, error)) (out Out, err error) {
	err = d.t.call(ctx, "dynamodb", op, func(ctx context.Context) error {
		out, err = fn(ctx, in, opts...)
		return err
	})
	return out, err
}

func (d *timedDynamoDB) GetItem(ctx context.Context, in *dynamodb.GetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	return timed(ctx, d, "GetItem", in, o, d.api.GetItem)
}

func (d *timedDynamoDB) PutItem(ctx context.Context, in *dynamodb.PutItemInput, o ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	return timed(ctx, d, "PutItem", in, o, d.api.PutItem)
}

func (d *timedDynamoDB) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	return timed(ctx, d, "UpdateItem", in, o, d.api.UpdateItem)
}

func (d *timedDynamoDB) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	return timed(ctx, d, "BatchGetItem", in, o, d.api.BatchGetItem)
}

func (d *timedDynamoDB) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, o ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	return timed(ctx, d, "TransactWriteItems", in, o, d.api.TransactWriteItems)
}

func (d *timedDynamoDB) DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, o ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error) {
	return timed(ctx, d, "DescribeTable", in, o, d.api.DescribeTable)
}

// RedisCall times one round trip of the Redis backend as operation op of
// backend "redis", in a span of its own (redis.Options.Call).
func (t *Telemetry) RedisCall(ctx context.Context, op string, fn func(context.Context) error) error {
	return t.call(ctx, "redis", op, fn)
}
