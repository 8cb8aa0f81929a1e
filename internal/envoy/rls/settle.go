package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/envoy/rules"
)

// Costs settled on stream done (rules.Rule.Settles): the
// request-time call spends an estimate, Envoy's stream-done call
// (apply_on_stream_done) replaces it by the actual cost, its hits_addend
// (e.g. %DYNAMIC_METADATA(...)% of the tokens an upstream used).
//
// How the two calls find each other: both descriptors carry the request
// id in an entry of key rules.RequestIDKey (a request_headers action
// on x-request-id), and the stream-done one also an entry of key
// rules.StreamDoneKey (a generic_key action). Both entries are
// removed before matching, so the two calls match the same rule and
// name the same subject. The evaluation id of the estimate is the
// pseudonym (settleKind) of the domain, the remaining entries and the
// request id: the stream-done call derives the same one, and settles the
// estimate remembered under it. The store keeps an estimate for
// rules.SettleDeadline (an hour), and a settle is idempotent: a
// retried stream-done call answers the same and changes nothing. A
// settling descriptor is decided in a check of its own.
//
// What cannot be settled is answered OK without changing anything more,
// counted in sluice_envoy_unsettled_total{rule, reason} and logged
// (throttled); an estimate never settled stays spent:
//
//   - no_request_id: the descriptor has no request id (or an empty one):
//     the request-time call spends its cost as a plain spend, and the
//     stream-done call spends nothing;
//   - no_cost: the stream-done call has no hits_addend (or
//     is_negative_hits), so no actual cost to settle at;
//   - no_estimate: nothing to settle under the id (the estimate was
//     denied, only checked with a hits_addend of 0, never sent, or
//     forgotten after its deadline; or a key rotation renamed it);
//   - unavailable: the store could not take the settle;
//   - limit_override: the stream-done call carries a limit override
//     (RateLimitDescriptor.limit), whose numbers never settle: nothing
//     is spent (its request-time call was a plain spend).
//
// A stream-done entry on a rule that does not settle changes nothing:
// the descriptor is decided as it would be without it.

// settleKind is the kind folded into the pseudonym that names an
// estimate and its settle.
const settleKind = "envoy-settle"

// settleCall is what a descriptor of a settling rule does.
type settleCall struct {
	id   string    // the evaluation id both calls derive
	op   sluice.Op // sluice.Estimate or sluice.Settle; 0 for neither
	done bool      // the stream-done call
	// why is the reason the call cannot settle, 0 when it can.
	why unsettled
}

// unsettled is why a descriptor of a settling rule could not settle; its
// String is the reason label of sluice_envoy_unsettled_total.
type unsettled uint8

const (
	settles unsettled = iota
	noRequestID
	noCost
	noEstimate
	storeUnavailable
	limitOverride
)

var unsettledNames = [...]string{settles: "", noRequestID: "no_request_id", noCost: "no_cost", noEstimate: "no_estimate", storeUnavailable: "unavailable", limitOverride: "limit_override"}

func (u unsettled) String() string { return unsettledNames[u] }

// ownEntries are sluice's own entries of a request descriptor.
type ownEntries struct {
	requestID string
	done      bool
	priority  string // the class the descriptor names (priority.go)
}

// takeOwnEntries removes sluice's own entries (rules.RequestIDKey,
// StreamDoneKey and PriorityKey) from entries, in place, and returns the
// entries left and what sluice's said. Each may appear once.
func takeOwnEntries(entries []rules.Entry) ([]rules.Entry, ownEntries, error) {
	var se ownEntries
	out := entries[:0]
	ids, dones, classes := 0, 0, 0
	for _, e := range entries {
		switch e.Key {
		case rules.RequestIDKey:
			se.requestID, ids = e.Value, ids+1
		case rules.StreamDoneKey:
			se.done, dones = true, dones+1
		case rules.PriorityKey:
			se.priority, classes = e.Value, classes+1
		default:
			out = append(out, e)
		}
	}
	switch {
	case ids > 1 || dones > 1:
		return out, se, fmt.Errorf("entries: %s or %s appears more than once: a descriptor carries one request id and one stream-done marker", rules.RequestIDKey, rules.StreamDoneKey)
	case classes > 1:
		return out, se, fmt.Errorf("entries: %s appears more than once: a descriptor carries one priority class", rules.PriorityKey)
	}
	return out, se, nil
}

// prepareSettle makes d, whose rule settles (or a stream-done call with
// a limit override, which cannot), the estimate (request time)
// or the settle (stream done) of the request rd, under the evaluation id
// derived from domain, entries (the descriptor's without sluice's own)
// and the request id se carries; reqHits is the request's hits_addend.
// A request-time check (hits_addend 0) or refund (is_negative_hits)
// stays what it is.
func prepareSettle(st *State, d *descriptor, rd *commonpb.RateLimitDescriptor, reqHits uint32, domain string, entries []rules.Entry, se ownEntries) {
	c := &d.settle
	c.done = se.done
	if d.override {
		c.why = limitOverride // stream done only: see match
		return
	}
	if !se.done && (d.cost == 0 || d.refund) {
		return // a check or a refund: nothing to settle
	}
	if se.requestID == "" {
		c.why = noRequestID
		return // request time: a plain spend; stream done: nothing
	}
	c.id = st.Pseudonymizer.Pseudonym(settleKind, identity(append(entries[:len(entries):len(entries)], rules.Entry{Key: rules.RequestIDKey, Value: se.requestID})), domain)
	if !se.done {
		c.op = sluice.Estimate
		return
	}
	h := rd.GetHitsAddend()
	switch {
	case rd.GetIsNegativeHits():
		c.why = noCost
	case h != nil:
		c.op, d.cost = sluice.Settle, settleCost(h.GetValue())
	case reqHits != 0:
		c.op, d.cost = sluice.Settle, settleCost(uint64(reqHits))
	default:
		c.why = noCost
	}
	d.refund = false
}

// settleCost is the actual cost a stream-done call's hits report, at
// most the most a store takes (algorithm.MaxLimit): a settle is never
// refused for its cost, the store's debt bound caps what it charges
// (twice the capacity counted, or a full bucket of debt), so a cost
// past the store's most charges what that most does.
func settleCost(hits uint64) int64 { return min(clampCost(hits), algorithm.MaxLimit) }

// idle reports whether d is a stream-done call of a settling rule that
// cannot settle: answered OK without the store.
func (c *settleCall) idle() bool { return c.done && c.op == 0 }

// settle replaces the estimate of g, a settle, by g.cost: always
// answered OK (a settle is never denied); one that cannot be taken is
// given its reason (see the file's comment). It counts on the core's
// settle counter (sluice_settled_units_total).
func (s *Service) settle(ctx context.Context, ds []descriptor, g *group, rp *reply) error {
	d := &ds[g.members[0]]
	req := sluice.Request{Policy: d.rule.Policy.ID, Subject: g.subject, Previous: g.previous, Op: sluice.Settle, EvaluationID: g.settle.id, Cost: g.cost}
	o := g.core.Check(ctx, req)
	for _, i := range g.members {
		d := &ds[i]
		sl := rp.status(rlspb.RateLimitResponse_OK, d.rule)
		d.status = &sl.status
		switch {
		case o.Kind == sluice.Allowed:
			sl.status.LimitRemaining = uint32(min(max(o.Remaining, 0), math.MaxUint32))
			sl.untilReset(o.ResetAfter)
		case o.Kind == sluice.Incompatible && errors.Is(o.Err, sluice.ErrInvalidRequest):
			d.settle.why = noEstimate
		default:
			d.settle.why = storeUnavailable
		}
	}
	return nil
}

// countUnsettled counts and logs every descriptor of ds whose rule
// settles and that could not (settleCall.why).
func (s *Service) countUnsettled(ctx context.Context, ds []descriptor) {
	for i := range ds {
		d := &ds[i]
		if d.settle.why == settles || d.rule == nil {
			continue
		}
		if s.metrics != nil {
			rule := rules.PolicyID(d.rule.Key)
			if d.override {
				rule = OverrideRule
			}
			s.metrics.unsettled.WithLabelValues(rule, d.settle.why.String()).Inc()
		}
		call := "request"
		if d.settle.done {
			call = "stream_done"
		}
		if d.core != nil {
			d.core.Log(ctx, slog.LevelWarn, "envoy rate limit: cost not settled; an estimate stays spent", slog.String("rule", d.rule.Key), slog.String("call", call), slog.String("reason", d.settle.why.String()))
		}
	}
}
