package ratelimit

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-rl/sluice/descriptors"
)

// dynamicMetadata is the response's dynamic_metadata, in the shape
// envoyproxy/ratelimit gives it (RESPONSE_DYNAMIC_METADATA), which Envoy
// hands to the filters after the rate-limit filter (under the filter's
// name) and to access logs:
//
//	domain       the request's domain
//	descriptors  one entry per request descriptor: entries ("key=value"
//	             strings), limit (a limit override, as text) and
//	             hitsAddend (the descriptor's own), each when present
//	hitsAddend   the request's hits_addend, when not 0
//	metadata     the `metadata` of the rules of the descriptors that
//	             passed (passed, in request order), merged: mappings
//	             merge key by key, and otherwise the first value of a key
//	             stays; absent when empty
func dynamicMetadata(req *rlsv3.RateLimitRequest, matches []descriptors.Match, matched []bool, passed []int) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.GetDomain())}
	list := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		entries := make([]*structpb.Value, 0, len(d.GetEntries()))
		for _, e := range d.GetEntries() {
			entries = append(entries, structpb.NewStringValue(e.GetKey()+"="+e.GetValue()))
		}
		df := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if l := d.GetLimit(); l != nil {
			df["limit"] = structpb.NewStringValue(l.String())
		}
		if h := d.GetHitsAddend(); h != nil {
			df["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		list = append(list, structpb.NewStructValue(&structpb.Struct{Fields: df}))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: list})
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	merged := map[string]any{}
	for _, i := range passed {
		if matched[i] && matches[i].Rule != nil {
			mergeFirst(merged, matches[i].Rule.Metadata)
		}
	}
	if len(merged) > 0 {
		// The rule files hold only what a Struct can (descriptors checks
		// it at load), so this cannot fail.
		if s, err := structpb.NewStruct(merged); err == nil {
			fields["metadata"] = structpb.NewStructValue(s)
		}
	}
	return &structpb.Struct{Fields: fields}
}

// mergeFirst merges src into dst: a key dst lacks is added; where both
// hold mappings they merge the same way; otherwise dst's value stays.
// Mappings copied from src are copied, not shared: a rule's metadata is
// part of an immutable config.
func mergeFirst(dst, src map[string]any) {
	for k, v := range src {
		have, ok := dst[k]
		if !ok {
			dst[k] = copyValue(v)
			continue
		}
		hm, ok1 := have.(map[string]any)
		sm, ok2 := v.(map[string]any)
		if ok1 && ok2 {
			mergeFirst(hm, sm)
		}
	}
}

func copyValue(v any) any {
	switch t := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(t))
		for k, e := range t {
			m[k] = copyValue(e)
		}
		return m
	case []any:
		l := make([]any, len(t))
		for i, e := range t {
			l[i] = copyValue(e)
		}
		return l
	}
	return v
}
