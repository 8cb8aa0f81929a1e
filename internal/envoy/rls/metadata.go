package rls

import (
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// dynamicMetadata is the answer's dynamic_metadata, in the shape
// envoyproxy/ratelimit sends with RESPONSE_DYNAMIC_METADATA (#1112,
// #1114), so Envoy config written for theirs reads it alike:
//
//	domain:      the request's domain
//	descriptors: one {entries: ["key=value", …], limit?, hitsAddend?} per
//	             request descriptor, limit being the override's text form
//	hitsAddend:  the request's, when not 0
//	metadata:    the metadata of the rules of the descriptors answered OK
//	             (unlimited ones aside), merged in request order: a name
//	             already set keeps its first value, mappings merge
//
// An AI gateway uses metadata to pick the backend whose quota
// (quota_mode) is not spent. The descriptor values go back to the Envoy
// that sent them; they reach no store, log line or metric.
func dynamicMetadata(req *rlspb.RateLimitRequest, ds []descriptor) *structpb.Struct {
	descs := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		entries := make([]*structpb.Value, len(d.GetEntries()))
		for i, e := range d.GetEntries() {
			entries[i] = structpb.NewStringValue(e.GetKey() + "=" + e.GetValue())
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if l := d.GetLimit(); l != nil {
			f["limit"] = structpb.NewStringValue(l.String())
		}
		if h := d.GetHitsAddend(); h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: f}))
	}
	out := &structpb.Struct{Fields: map[string]*structpb.Value{
		"domain":      structpb.NewStringValue(req.GetDomain()),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: descs}),
	}}
	if h := req.GetHitsAddend(); h != 0 {
		out.Fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := range ds {
		d := &ds[i]
		if d.rule != nil && !d.rule.Unlimited && d.rule.Metadata != nil && d.status.GetCode() == rlspb.RateLimitResponse_OK {
			mergeFirst(passed, d.rule.Metadata)
		}
	}
	if len(passed.Fields) > 0 {
		out.Fields["metadata"] = structpb.NewStructValue(passed)
	}
	return out
}

// mergeFirst adds src's fields to dst: a name dst lacks takes src's
// value, copied (src is a rule's, shared by every request); where both
// hold mappings they merge alike; any other name dst already has keeps
// dst's value.
func mergeFirst(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		have, ok := dst.Fields[k]
		switch {
		case !ok:
			dst.Fields[k] = proto.Clone(v).(*structpb.Value)
		case have.GetStructValue() != nil && v.GetStructValue() != nil:
			mergeFirst(have.GetStructValue(), v.GetStructValue())
		}
	}
}
