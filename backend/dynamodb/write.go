package dynamodb

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// op is one planned write: a whole item (create, rewrite) or an update
// (incremental), with its condition.
type op struct {
	put  map[string]types.AttributeValue // whole item, or nil
	key  map[string]types.AttributeValue // for an update
	e    *expr
	next *bucketItem // what the item holds after a put
}

// write persists the planned targets: one conditional write for one
// bucket, one transaction for a cascade. On a lost race every target
// holds what the table returned and errLostRace is returned.
func (b *Backend) write(ctx context.Context, ts []target, now int64) error {
	ops := make([]op, len(ts))
	for i := range ts {
		ops[i] = b.plannedOp(&ts[i], now)
	}
	if len(ts) == 1 {
		return b.writeOne(ctx, &ts[0], ops[0])
	}
	return b.writeTx(ctx, ts, ops)
}

// plannedOp turns t's plan into a conditional write.
//
// The incremental write is the steady state, in one of two forms.
//
// A consuming write takes the cost from tokens the bucket already holds
// and leaves the refill clock alone: it only ADDs -cost, on the condition
// that, whatever other writers did meanwhile, the bucket holds at least
// the cost and stays below its burst even with the refill still pending
// (tk <= burst - pending - 1). Refill is exact in whole steps from the
// clock, so when no cap is reached the pending tokens are credited
// exactly as if they had been credited now; the condition guarantees no
// cap is reached, so nothing is back-dated. Such writes commute: any
// number of replicas consume from one bucket without invalidating each
// other.
//
// A refilling write is needed when the cost needs the refill, when the
// refill reaches the burst (the clock must then move to now), or for a
// refund. It moves the clock to where the refill left it and ADDs the
// difference in tokens, on the condition that the clock is still the one
// the refill started from and that the tokens stay within [0, burst]
// after the ADD. A writer whose clock has moved on recomputes.
//
// Either way concurrent writers never lose each other's consumption and a
// stale view can never lift a bucket past its burst (pitfalls 1 and 8).
func (b *Backend) plannedOp(t *target, now int64) op {
	e := newExpr()
	nowSec := now / 1000
	ttl := b.ttlSeconds(t.res, now)
	if t.mode != incremental {
		item := &bucketItem{cfg: t.fp, ttl: ttl, limits: t.res.Limits, states: t.states}
		av := b.itemKey(t.key)
		av[attrEntity] = str(t.key.entity)
		av[attrResource] = str(t.key.resource)
		av[attrGSI2PK] = str(b.keys.GSI2PK(t.key.resource))
		av[attrGSI2SK] = str(GSI2SK(t.key.entity))
		av[attrCfg] = str(t.fp)
		if ttl != 0 {
			av[attrTTL] = num(ttl)
		}
		for i, l := range t.res.Limits {
			s := t.states[i]
			av[limitAttr(bucketPrefix, l.Name, fieldTokens)] = num(s.Tokens)
			av[limitAttr(bucketPrefix, l.Name, fieldCapacity)] = num(l.Amount)
			av[limitAttr(bucketPrefix, l.Name, fieldBurst)] = num(l.Burst)
			av[limitAttr(bucketPrefix, l.Name, fieldAmount)] = num(l.Amount)
			av[limitAttr(bucketPrefix, l.Name, fieldPeriod)] = num(l.Period)
			av[limitAttr(bucketPrefix, l.Name, fieldConsumed)] = num(s.Consumed)
			av[limitAttr(bucketPrefix, l.Name, fieldClock)] = num(s.Clock)
		}
		if t.mode == create {
			// Nothing there, or only an item whose ttl has passed.
			e.when("attribute_not_exists(%n) OR %n <= %v", []string{attrPK, attrTTL}, []types.AttributeValue{num(nowSec)})
		} else {
			// Exactly the item the rewrite was computed from.
			old := t.item
			e.when("%n = %v", []string{attrCfg}, []types.AttributeValue{str(old.cfg)})
			for i, l := range old.limits {
				e.when("%n = %v AND %n = %v",
					[]string{limitAttr(bucketPrefix, l.Name, fieldTokens), limitAttr(bucketPrefix, l.Name, fieldClock)},
					[]types.AttributeValue{num(old.states[i].Tokens), num(old.states[i].Clock)})
			}
			notExpired(e, nowSec)
		}
		return op{put: av, e: e, next: item}
	}

	if ttl != 0 {
		e.setAttr(attrTTL, num(ttl))
	} else {
		e.removeAttr(attrTTL)
	}
	e.when("%n = %v", []string{attrCfg}, []types.AttributeValue{str(t.fp)})
	notExpired(e, nowSec)
	if pending, ok := t.consumesWithoutRefill(now); ok {
		for i, l := range t.res.Limits {
			tk := limitAttr(bucketPrefix, l.Name, fieldTokens)
			cost := t.states[i].Consumed - t.base[i].Consumed
			if cost > 0 {
				e.addAttr(tk, num(-cost))
				e.addAttr(limitAttr(bucketPrefix, l.Name, fieldConsumed), num(cost))
			}
			e.when("%n BETWEEN %v AND %v", []string{tk}, []types.AttributeValue{num(cost), num(l.Burst - pending[i] - 1)})
		}
		return op{key: b.itemKey(t.key), e: e}
	}
	for i, l := range t.res.Limits {
		base, next := t.base[i], t.states[i]
		tk := limitAttr(bucketPrefix, l.Name, fieldTokens)
		rf := limitAttr(bucketPrefix, l.Name, fieldClock)
		delta := next.Tokens - base.Tokens
		if next.Clock != base.Clock {
			e.setAttr(rf, num(next.Clock))
		}
		if delta != 0 {
			e.addAttr(tk, num(delta))
		}
		if used := next.Consumed - base.Consumed; used > 0 {
			e.addAttr(limitAttr(bucketPrefix, l.Name, fieldConsumed), num(used))
		}
		e.when("%n = %v AND %n BETWEEN %v AND %v", []string{rf, tk},
			[]types.AttributeValue{num(base.Clock), num(-delta), num(l.Burst - delta)})
	}
	return op{key: b.itemKey(t.key), e: e}
}

// consumesWithoutRefill reports whether t's decision can be written as a
// consuming write: a consumption (not a refund) that every limit can pay
// from the tokens it held before refilling, where refilling would not
// reach the burst. It returns each limit's pending refill.
func (t *target) consumesWithoutRefill(now int64) ([]int64, bool) {
	if t.refund {
		return nil, false
	}
	pending := make([]int64, len(t.res.Limits))
	for i, l := range t.res.Limits {
		base := t.base[i]
		refilled := bucket.Refill(l, base, now)
		if base.Tokens < t.states[i].Consumed-base.Consumed || refilled.Tokens >= l.Burst {
			return nil, false
		}
		pending[i] = refilled.Tokens - base.Tokens
	}
	return pending, true
}

// notExpired conditions a write on an item whose ttl has not passed.
func notExpired(e *expr, nowSec int64) {
	e.when("attribute_not_exists(%n) OR %n > %v", []string{attrTTL, attrTTL}, []types.AttributeValue{num(nowSec)})
}

func (b *Backend) writeOne(ctx context.Context, t *target, o op) error {
	var err error
	if o.put != nil {
		var out *dynamodb.PutItemOutput
		out, err = b.api.PutItem(ctx, &dynamodb.PutItemInput{
			TableName:                           aws.String(b.table),
			Item:                                o.put,
			ConditionExpression:                 o.e.condition(),
			ExpressionAttributeNames:            o.e.names,
			ExpressionAttributeValues:           o.e.valuesOrNil(),
			ReturnConsumedCapacity:              types.ReturnConsumedCapacityTotal,
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		b.stats.call("PutItem", err)
		if err == nil {
			b.stats.consumedWrite(out.ConsumedCapacity)
			t.item, t.fresh = o.next, true
			b.seen.Add(t.key, seenItem{item: o.next, at: b.now()})
			return nil
		}
	} else {
		var out *dynamodb.UpdateItemOutput
		out, err = b.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                           aws.String(b.table),
			Key:                                 o.key,
			UpdateExpression:                    o.e.update(),
			ConditionExpression:                 o.e.condition(),
			ExpressionAttributeNames:            o.e.names,
			ExpressionAttributeValues:           o.e.valuesOrNil(),
			ReturnValues:                        types.ReturnValueAllNew,
			ReturnConsumedCapacity:              types.ReturnConsumedCapacityTotal,
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		b.stats.call("UpdateItem", err)
		if err == nil {
			b.stats.consumedWrite(out.ConsumedCapacity)
			return b.saw(t, out.Attributes)
		}
	}
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		if err := b.saw(t, ccf.Item); err != nil {
			return err
		}
		return errLostRace{err}
	}
	return fmt.Errorf("writing bucket %q/%q: %w", t.key.entity, t.key.resource, err)
}

// writeTx charges a cascade's buckets in one transaction. Its
// cancellation reasons say, per item, whether a condition failed (the
// item is returned and the decision recomputed) or the transaction met
// another one (retried after a pause): neither means "over the limit"
// (pitfall 10).
func (b *Backend) writeTx(ctx context.Context, ts []target, ops []op) error {
	items := make([]types.TransactWriteItem, len(ops))
	for i, o := range ops {
		if o.put != nil {
			items[i].Put = &types.Put{
				TableName: aws.String(b.table), Item: o.put,
				ConditionExpression: o.e.condition(), ExpressionAttributeNames: o.e.names,
				ExpressionAttributeValues:           o.e.valuesOrNil(),
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			}
		} else {
			items[i].Update = &types.Update{
				TableName: aws.String(b.table), Key: o.key, UpdateExpression: o.e.update(),
				ConditionExpression: o.e.condition(), ExpressionAttributeNames: o.e.names,
				ExpressionAttributeValues:           o.e.valuesOrNil(),
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			}
		}
	}
	out, err := b.api.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
		TransactItems: items, ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	})
	b.stats.call("TransactWriteItems", err)
	if err == nil {
		b.stats.consumedWrite(each(out.ConsumedCapacity)...)
		for i := range ts {
			next := ops[i].next
			if next == nil {
				// An update's result is not returned by a transaction: keep
				// what it computed. The next write's condition checks it.
				next = &bucketItem{cfg: ts[i].fp, ttl: ts[i].item.ttl, limits: ts[i].res.Limits, states: ts[i].states}
			}
			ts[i].item = next
			b.seen.Add(ts[i].key, seenItem{item: next, at: b.now()})
		}
		return nil
	}
	var tce *types.TransactionCanceledException
	if !errors.As(err, &tce) {
		return fmt.Errorf("writing cascade %q/%q: %w", ts[0].key.entity, ts[0].key.resource, err)
	}
	lost := false
	for i, r := range tce.CancellationReasons {
		if i >= len(ts) {
			break
		}
		switch aws.ToString(r.Code) {
		case "None", "":
		case "ConditionalCheckFailed":
			if err := b.saw(&ts[i], r.Item); err != nil {
				return err
			}
			lost = true
		case "TransactionConflict":
			lost = true
		default:
			return fmt.Errorf("writing cascade %q/%q: %s: %w", ts[0].key.entity, ts[0].key.resource, aws.ToString(r.Code), err)
		}
	}
	if lost {
		return errLostRace{err}
	}
	return fmt.Errorf("writing cascade %q/%q: %w", ts[0].key.entity, ts[0].key.resource, err)
}
