package dynamodb

import (
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// expr builds update and condition expressions whose every attribute name
// and value is a generated placeholder (#a0, :v0). Limit names may hold
// '-', '.' or anything else, and DynamoDB rejects those inside an
// expression (pitfall 5); placeholders make any name safe.
type expr struct {
	names  map[string]string
	values map[string]types.AttributeValue
	byName map[string]string // attribute -> its placeholder
	set    []string
	add    []string
	remove []string
	cond   []string
}

func newExpr() *expr {
	return &expr{names: map[string]string{}, values: map[string]types.AttributeValue{}, byName: map[string]string{}}
}

// name returns the placeholder of attribute a.
func (e *expr) name(a string) string {
	if p, ok := e.byName[a]; ok {
		return p
	}
	p := "#a" + strconv.Itoa(len(e.byName))
	e.byName[a] = p
	e.names[p] = a
	return p
}

// value returns a new placeholder for v.
func (e *expr) value(v types.AttributeValue) string {
	p := ":v" + strconv.Itoa(len(e.values))
	e.values[p] = v
	return p
}

func (e *expr) setAttr(a string, v types.AttributeValue) {
	e.set = append(e.set, e.name(a)+" = "+e.value(v))
}

// setMinus sets attribute a to v less attribute b, as the item holds b
// before the write.
func (e *expr) setMinus(a string, v types.AttributeValue, b string) {
	e.set = append(e.set, e.name(a)+" = "+e.value(v)+" - "+e.name(b))
}

// setIfAbsent sets attribute a to v unless the item holds it already.
func (e *expr) setIfAbsent(a string, v types.AttributeValue) {
	n := e.name(a)
	e.set = append(e.set, n+" = if_not_exists("+n+", "+e.value(v)+")")
}

func (e *expr) addAttr(a string, v types.AttributeValue) {
	e.add = append(e.add, e.name(a)+" "+e.value(v))
}

func (e *expr) removeAttr(a string) { e.remove = append(e.remove, e.name(a)) }

// when adds one clause to the condition; %n is replaced by the name
// placeholders of names and %v by the value placeholders of values, in
// order.
func (e *expr) when(clause string, names []string, values []types.AttributeValue) {
	var b strings.Builder
	ni, vi := 0, 0
	for i := 0; i < len(clause); i++ {
		if clause[i] == '%' && i+1 < len(clause) {
			switch clause[i+1] {
			case 'n':
				b.WriteString(e.name(names[ni]))
				ni++
				i++
				continue
			case 'v':
				b.WriteString(e.value(values[vi]))
				vi++
				i++
				continue
			}
		}
		b.WriteByte(clause[i])
	}
	e.cond = append(e.cond, "("+b.String()+")")
}

func (e *expr) update() *string {
	var parts []string
	if len(e.set) > 0 {
		parts = append(parts, "SET "+strings.Join(e.set, ", "))
	}
	if len(e.add) > 0 {
		parts = append(parts, "ADD "+strings.Join(e.add, ", "))
	}
	if len(e.remove) > 0 {
		parts = append(parts, "REMOVE "+strings.Join(e.remove, ", "))
	}
	s := strings.Join(parts, " ")
	return &s
}

func (e *expr) condition() *string {
	if len(e.cond) == 0 {
		return nil
	}
	s := strings.Join(e.cond, " AND ")
	return &s
}

func (e *expr) valuesOrNil() map[string]types.AttributeValue {
	if len(e.values) == 0 {
		return nil
	}
	return e.values
}
