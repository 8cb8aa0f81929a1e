package rls

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoy/rules"
	"github.com/sluicehq/sluice/internal/form"
	"github.com/sluicehq/sluice/internal/ratelimitheader"
)

// answer is the answer to req, whose descriptors ds are decided, or err
// when none can be given, counted in the metrics: the descriptors'
// statuses, with shadow_mode rules' OVER_LIMIT answered OK; the overall
// code (OVER_LIMIT when a descriptor outside quota_mode is, or when every
// quota_mode descriptor is); the response headers; with
// State.ResponseMetadata the dynamic metadata. Every descriptor is
// counted, and what match or the store could not do as asked (a settle,
// a class, a limit) counted and logged, in one pass.
func (s *Service) answer(ctx context.Context, st *State, req *rlspb.RateLimitRequest, ds []descriptor, err error) (*rlspb.RateLimitResponse, error) {
	if err != nil {
		s.countRequest(nil, err)
		return nil, err
	}
	rp := newReply(len(ds))
	resp := &rp.resp // its Statuses sized for ds
	resp.OverallCode = rlspb.RateLimitResponse_OK
	var quota, quotaOver int // quota_mode descriptors, and those over
	for i := range ds {
		d := &ds[i]
		if d.dup > 0 {
			e := &ds[d.dup-1] // answered alike
			d.code, d.remaining, d.reset, d.timed = e.code, e.remaining, e.reset, e.timed
			d.decided, d.failedOpen = e.decided, e.failedOpen
		}
		code := d.code
		if d.rule != nil && d.rule.Shadow && code == rlspb.RateLimitResponse_OVER_LIMIT {
			// shadow_mode: decided and counted, never enforced.
			s.countDescriptor(d, "shadow_over_limit")
			code = rlspb.RateLimitResponse_OK
		} else {
			s.countDescriptor(d, codeLabel(d))
		}
		s.countAsked(ctx, d)
		resp.Statuses[i] = rp.status(code, limitOf(d)).of(d)
		over := code == rlspb.RateLimitResponse_OVER_LIMIT
		switch {
		case d.rule != nil && d.rule.QuotaMode && !d.rule.Unlimited:
			quota++
			if over {
				quotaOver++
			}
		case over:
			resp.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT
		}
	}
	if quota > 0 && quotaOver == quota {
		resp.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT // every quota is spent
	}
	resp.ResponseHeadersToAdd = headers(ds, resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT, rp)
	if st.ResponseMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, ds, resp.Statuses)
	}
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.LogAttrs(ctx, slog.LevelDebug, "envoy rate limit", slog.String("domain", req.GetDomain()), slog.Int("descriptors", len(ds)), slog.String("overall_code", resp.OverallCode.String()))
	}
	s.countRequest(resp, nil)
	return resp, nil
}

// limitOf is the rule whose current_limit d's status carries: nil for
// no rule and for an unlimited one.
func limitOf(d *descriptor) *rules.Rule {
	if d.rule == nil || d.rule.Unlimited {
		return nil
	}
	return d.rule
}

// countDescriptor counts d in sluice_envoy_descriptors_total under code.
func (s *Service) countDescriptor(d *descriptor, code string) {
	m := s.metrics
	if m == nil {
		return
	}
	label := NoRule
	switch {
	case d.rule != nil:
		label = d.rule.Label // OverrideRule for a limit override's
	case d.replaced != nil:
		label = d.replaced.Label
	}
	k := descriptorLabels{label, code}
	if c, ok := m.descriptorC.Load(k); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	c := m.descriptors.WithLabelValues(label, code)
	m.descriptorC.Store(k, c)
	c.Inc()
}

// codeLabel is the code label of a descriptor's final status.
func codeLabel(d *descriptor) string {
	switch {
	case d.replaced != nil:
		return "replaced"
	case d.release && !d.failedOpen:
		return "released"
	case d.rule == nil:
		return "no_rule"
	case d.failedOpen:
		return "failed_open"
	case d.settle.done && d.settle.why == settles:
		return "settled"
	case d.settle.done:
		return "unsettled"
	case d.rule.Unlimited:
		return "unlimited"
	case d.code == rlspb.RateLimitResponse_OVER_LIMIT:
		return "over_limit"
	}
	return "ok"
}

// countAsked counts and logs (throttled, on d's core) what d asked that
// was not done as asked: a cost its rule settles that could not be
// (settleCall.why), a class its rule does not declare (decided as the
// default), a limit its in-flight rule ignores. Never with a value the
// client sent: the rule's key names what happened.
func (s *Service) countAsked(ctx context.Context, d *descriptor) {
	if d.rule == nil || d.settle.why == settles && !d.unknownClass && !d.ignoredLimit {
		return
	}
	rule := d.rule.Label
	if d.settle.why != settles {
		if s.metrics != nil {
			s.metrics.unsettled.WithLabelValues(rule, d.settle.why.String()).Inc()
		}
		call := "request"
		if d.settle.done {
			call = "stream_done"
		}
		d.log(ctx, "envoy rate limit: cost not settled; an estimate stays spent", slog.String("rule", d.rule.Key), slog.String("call", call), slog.String("reason", d.settle.why.String()))
	}
	if d.unknownClass {
		if s.metrics != nil {
			s.metrics.unknownPriority.WithLabelValues(rule).Inc()
		}
		d.log(ctx, "envoy rate limit: a priority class the rule does not declare; decided as the default class", slog.String("rule", d.rule.Key), slog.String("key", rules.PriorityKey))
	}
	if d.ignoredLimit {
		if s.metrics != nil {
			s.metrics.ignoredLimit.WithLabelValues(rule).Inc()
		}
		d.log(ctx, "envoy rate limit: a descriptor's limit on an in-flight rule is ignored; the rule's in-flight limit decides", slog.String("rule", d.rule.Key), slog.String("field", "limit"))
	}
}

// log logs a warning about d on its core, throttled; a limit override
// of 0 per unit has no core, and logs nothing.
func (d *descriptor) log(ctx context.Context, msg string, attrs ...slog.Attr) {
	if d.core != nil {
		d.core.Log(ctx, slog.LevelWarn, msg, attrs...)
	}
}

// countRequest counts the answer resp, or the error err, in
// sluice_envoy_requests_total.
func (s *Service) countRequest(resp *rlspb.RateLimitResponse, err error) {
	m := s.metrics
	if m == nil {
		return
	}
	if err != nil {
		m.requests.WithLabelValues(status.Code(err).String()).Inc()
		return
	}
	switch code := resp.GetOverallCode(); code {
	case rlspb.RateLimitResponse_OK:
		m.ok.Inc()
	case rlspb.RateLimitResponse_OVER_LIMIT:
		m.over.Inc()
	default:
		m.requests.WithLabelValues(code.String()).Inc()
	}
}

// reply is the answer to one request with the descriptor statuses and
// the messages they point to: for a request of one descriptor (Envoy's
// usual) all in one allocation, the RateLimit-Policy and RateLimit
// header values included (Retry-After, only over the limit, is one of
// its own: a third value in every reply was 96 bytes of 712).
type reply struct {
	resp     rlspb.RateLimitResponse
	statuses [1]*rlspb.RateLimitResponse_DescriptorStatus
	one      [1]slot
	slots    []slot // handed out in order; one[:] for one descriptor
	headers  [3]*corepb.HeaderValue
	header   [2]corepb.HeaderValue
}

// slot is one descriptor status and what it points to.
type slot struct {
	status rlspb.RateLimitResponse_DescriptorStatus
	limit  rlspb.RateLimitResponse_RateLimit
	reset  durationpb.Duration
}

// newReply returns the reply of a request of n descriptors: statuses for
// n, and a slot for each (one status per descriptor is the rule; a
// status past them is allocated alone).
func newReply(n int) *reply {
	rp := &reply{}
	if n == 1 {
		rp.slots, rp.resp.Statuses = rp.one[:], rp.statuses[:]
	} else {
		rp.slots, rp.resp.Statuses = make([]slot, n), make([]*rlspb.RateLimitResponse_DescriptorStatus, n)
	}
	return rp
}

// status returns the slot of a new descriptor status of code; with r,
// carrying r's current_limit.
func (rp *reply) status(code rlspb.RateLimitResponse_Code, r *rules.Rule) *slot {
	var sl *slot
	if len(rp.slots) > 0 {
		sl, rp.slots = &rp.slots[0], rp.slots[1:]
	} else {
		sl = new(slot)
	}
	sl.status.Code = code
	if r != nil {
		sl.limit.Name, sl.limit.RequestsPerUnit, sl.limit.Unit = r.Name, uint32(r.RequestsPerUnit), rlspb.RateLimitResponse_RateLimit_Unit(r.Unit)
		sl.status.CurrentLimit = &sl.limit
	}
	return sl
}

// of fills in sl's numbers from d's decision (limit_remaining and, when
// timed, duration_until_reset) and returns its status.
func (sl *slot) of(d *descriptor) *rlspb.RateLimitResponse_DescriptorStatus {
	sl.status.LimitRemaining = d.remaining
	if d.timed {
		sl.untilReset(d.reset)
	}
	return &sl.status
}

// untilReset sets the status's duration_until_reset to d, as
// durationpb.New(d) makes it.
func (sl *slot) untilReset(d time.Duration) {
	nanos := d.Nanoseconds()
	secs := nanos / 1e9
	sl.reset.Seconds, sl.reset.Nanos = secs, int32(nanos-secs*1e9)
	sl.status.DurationUntilReset = &sl.reset
}

// oneHeaders is headers for the common request, where at most one
// descriptor was decided by the store: the same header values, written
// into one buffer sized for them and converted once, without headers'
// map and slices, the header values rp's. It reports false when more
// than one was decided.
func oneHeaders(ds []descriptor, over bool, rp *reply) ([]*corepb.HeaderValue, bool) {
	var one *descriptor
	for i := range ds {
		if ds[i].decided != nil {
			if one != nil {
				return nil, false
			}
			one = &ds[i]
		}
	}
	if one == nil {
		return nil, true
	}
	st := one.decided
	b := make([]byte, 0, 128)
	b = append(b, one.rule.PolicyItem...)
	n := len(b)
	b = ratelimitheader.AppendLimitField(b, sluice.Outcome{Status: *st})
	s := string(b)
	h := &rp.header
	h[0].Key, h[0].Value = "RateLimit-Policy", s[:n]
	h[1].Key, h[1].Value = "RateLimit", s[n:]
	hs := append(rp.headers[:0], &h[0], &h[1])
	if over && !one.rule.Shadow && !st.Allowed {
		hs = append(hs, &corepb.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(ratelimitheader.RetryAfterSeconds(st.RetryAfter), 10)})
	}
	return hs, true
}

// headers returns the RateLimit-Policy and RateLimit fields for the
// rules the store decided, shadow ones included (their answer carries
// what an enforced one would), the most restrictive first, and
// Retry-After from the enforced rules when the request is over the
// limit. This is the one place the service calls the field serializer.
func headers(ds []descriptor, over bool, rp *reply) []*corepb.HeaderValue {
	if hs, ok := oneHeaders(ds, over, rp); ok {
		return hs
	}
	var decided []*rules.Rule
	var statuses, enforced []sluice.Status
	seen := map[string]bool{}
	for i := range ds {
		if d := &ds[i]; d.decided != nil && !seen[d.rule.Policy.ID] {
			seen[d.rule.Policy.ID] = true
			decided = append(decided, d.rule)
			statuses = append(statuses, *d.decided)
			if !d.rule.Shadow {
				enforced = append(enforced, *d.decided)
			}
		}
	}
	if len(statuses) == 0 {
		return nil
	}
	var pol []byte
	for i, r := range decided {
		if i > 0 {
			pol = append(pol, ", "...)
		}
		pol = append(pol, r.PolicyItem...) // the rule's, made when it loaded
	}
	o := sluice.Outcome{Status: statuses[form.MostRestrictive(statuses)]}
	if len(statuses) > 1 {
		o.Statuses = statuses
	}
	hs := []*corepb.HeaderValue{
		{Key: "RateLimit-Policy", Value: string(pol)},
		{Key: "RateLimit", Value: string(ratelimitheader.AppendLimitField(nil, o))},
	}
	if over && len(enforced) > 0 {
		if most := enforced[form.MostRestrictive(enforced)]; !most.Allowed {
			hs = append(hs, &corepb.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(ratelimitheader.RetryAfterSeconds(most.RetryAfter), 10)})
		}
	}
	return hs
}

// dynamicMetadata is the answer's dynamic_metadata (statuses being
// ds's, as answered), in the shape
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
func dynamicMetadata(req *rlspb.RateLimitRequest, ds []descriptor, statuses []*rlspb.RateLimitResponse_DescriptorStatus) *structpb.Struct {
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
		if d.rule != nil && !d.rule.Unlimited && d.rule.Metadata != nil && statuses[i].GetCode() == rlspb.RateLimitResponse_OK {
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
