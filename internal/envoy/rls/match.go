package rls

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/edge"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/envoy/rules"
	"github.com/sluicehq/sluice/subject"
)

// descriptor is one request descriptor on its way to an answer: what
// match read of it, what the store decided (rls.go), from which answer.go
// builds its status.
type descriptor struct {
	rule     *rules.Rule
	core     *edge.Core // decides rule: the State's, or a limit override's
	override bool       // rule is a limit override's
	// dup is 1 + the index of the earlier descriptor this one repeats
	// (same rule, subject, cost and kind): it is counted once, with that
	// one, and answered alike. 0 for none.
	dup      int
	subject  string
	previous []string // subject under older keys during a key rotation
	cost     int64
	refund   bool
	// lease names the lease of an in-flight rule (Rule.InFlight), which
	// the descriptor acquires, or gives back when release is set.
	lease   string
	release bool
	settle  settleCall // a settling rule's estimate or settle
	// priority is the class the descriptor is decided as
	// (sluice.Request.Priority; "" for the default class), and
	// unknownClass reports that it named one its rule does not declare,
	// decided as the default (classOf).
	priority     string
	unknownClass bool
	// ignoredLimit: the descriptor carried a limit its rule ignores (an
	// in-flight rule decides alone).
	ignoredLimit bool
	// The answer as decided: code (UNKNOWN until decided), and for a
	// status with numbers remaining and, when timed, the time to reset.
	code      rlspb.RateLimitResponse_Code
	remaining uint32
	reset     time.Duration
	timed     bool
	// decided is the store's verdict, for the response headers (a
	// shadow rule's too: its answer carries what an enforced one would):
	// verdict, or a repeated descriptor's.
	decided *sluice.Status
	verdict sluice.Status
	// replaced is the rule another matched rule's replaces dropped (rule
	// is then nil): counted as replaced, not as no rule.
	replaced *rules.Rule
	// failedOpen: the store could not decide and the rule fails open.
	failedOpen bool
}

// match reads req's descriptors into sc.ds with their rules, costs and
// subjects: sluice's own entries are read once, before matching
// (takeOwnEntries), and what they ask of the rule matched (a class, a
// lease, a settle) is decided here. A descriptor whose rule another
// matched rule replaces has no rule: it is neither decided nor spent.
// The error, InvalidArgument, is a request out of st's bounds or one
// sluice cannot decide (e.g. a limit override it cannot apply).
func (st *State) match(req *rlspb.RateLimitRequest, sc *scratch) error {
	domain := req.GetDomain()
	if err := st.bounds(req); err != nil {
		return invalid(err)
	}
	n := len(req.Descriptors)
	if cap(sc.ds) < n {
		sc.ds = make([]descriptor, n)
	}
	sc.ds = sc.ds[:n]
	reqCost := int64(req.GetHitsAddend())
	if reqCost == 0 {
		reqCost = 1
	}
	var replaced map[string]bool
	entries := sc.entries[:0]
	defer func() { sc.entries = entries }() // keeps its buffer for the next request
	for i, rd := range req.Descriptors {
		entries = entries[:0]
		for _, e := range rd.GetEntries() {
			entries = append(entries, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		var own ownEntries
		var err error
		if entries, own, err = takeOwnEntries(entries); err != nil {
			return invalid(fmt.Errorf("descriptors[%d].%w", i, err))
		}
		d := &sc.ds[i]
		*d = descriptor{core: st.core, cost: reqCost, refund: rd.GetIsNegativeHits()}
		if h := rd.GetHitsAddend(); h != nil {
			d.cost = clampCost(h.GetValue()) // the descriptor's wins; 0 checks without spending
		}
		var vars []rules.Entry
		d.rule, vars = st.Rules.AppendMatch(sc.vars, domain, entries)
		sc.vars = vars
		if o := rd.GetLimit(); o != nil && len(entries) > 0 {
			switch {
			case d.rule != nil && d.rule.InFlight:
				d.ignoredLimit = true // leases, not a count per unit: the rule decides
			case d.rule != nil || st.Rules.HasDomain(domain):
				ol, err := st.override(o)
				if err != nil {
					return invalid(fmt.Errorf("descriptors[%d].%w", i, err))
				}
				// Every entry names the budget, as envoyproxy/ratelimit keys an
				// override by the whole descriptor.
				d.rule, d.core, d.override, vars = ol.rule, ol.core, true, entries
			}
		}
		if d.rule == nil {
			continue
		}
		d.priority, d.unknownClass = classOf(d.rule, own.priority)
		if d.rule.InFlight {
			if vars, err = st.inFlight(d, rd, domain, vars); err != nil {
				return invalid(fmt.Errorf("descriptors[%d]: %w", i, err))
			}
		}
		if d.rule.Settles || own.done && d.override {
			st.prepareSettle(d, rd, req.GetHitsAddend(), domain, entries, own)
		}
		sc.id = appendIdentity(sc.id[:0], vars)
		id := string(sc.id) // does not escape: on the stack when short
		d.subject = st.Pseudonymizer.Pseudonym(SubjectKind, id, domain)
		d.previous = st.Pseudonymizer.Previous(SubjectKind, id, domain)
		for _, name := range d.rule.Replaces {
			if replaced == nil {
				replaced = map[string]bool{}
			}
			replaced[name] = true
		}
	}
	dropReplaced(sc.ds, replaced)
	return nil
}

// dropReplaced drops the rule of every descriptor of ds that replaced
// (the names in matched rules' replaces) holds: it is neither decided
// nor spent, and counted as replaced.
func dropReplaced(ds []descriptor, replaced map[string]bool) {
	for i := range ds {
		if r := ds[i].rule; r != nil && r.Name != "" && replaced[r.Name] {
			ds[i].rule, ds[i].replaced = nil, r
		}
	}
}

// invalid is the answer to a request sluice cannot decide.
func invalid(err error) error { return status.Error(codes.InvalidArgument, "sluice: "+err.Error()) }

// bounds checks req against st's bounds: a domain, at least one
// descriptor, at most MaxDescriptors, each with at most MaxEntries
// entries.
func (st *State) bounds(req *rlspb.RateLimitRequest) error {
	if req.GetDomain() == "" {
		return errors.New("domain must not be empty")
	}
	maxD, maxE := st.MaxDescriptors, st.MaxEntries
	if maxD <= 0 {
		maxD = DefaultMaxDescriptors
	}
	if maxE <= 0 {
		maxE = DefaultMaxEntries
	}
	ds := req.GetDescriptors()
	switch {
	case len(ds) == 0:
		return errors.New("descriptors must not be empty")
	case len(ds) > maxD:
		return fmt.Errorf("descriptors: %d: at most %d per request (envoy.max_descriptors)", len(ds), maxD)
	}
	for i, d := range ds {
		if n := len(d.GetEntries()); n > maxE {
			return fmt.Errorf("descriptors[%d].entries: %d: at most %d per descriptor (envoy.max_entries)", i, n, maxE)
		}
	}
	return nil
}

// clampCost converts a hits_addend to a cost.
func clampCost(h uint64) int64 { return int64(min(h, math.MaxInt64)) }

// ownEntries are sluice's own entries of a request descriptor.
type ownEntries struct {
	requestID string // the request id a settle names its estimate by
	done      bool   // the stream-done marker
	priority  string // the class the descriptor names (classOf)
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

// Priorities on one budget (docs/priorities.md) from a descriptor: a
// rule with sluice_priorities (rules.PrioritiesKey) shares its
// budget among classes, and a request descriptor names its class in an
// entry of key rules.PriorityKey (a request_headers action on a
// header only trusted filters set, or a generic_key per route). The
// entry is removed before matching, as sluice's settle entries are, so
// the same rule matches with and without it and names the same subject.
//
// The class is per descriptor: descriptors of one subject and cost but
// different classes are decided in separate checks (groupDescriptors),
// in the usual order, and once one of the subject's is denied the rest
// only check, whatever their class.
//
// A class the descriptor's rule declares is the request's class
// (sluice.Request.Priority). Any other value is decided as the default
// class (algorithm.DefaultClass), never answered with an error: Envoy's
// failure_mode_deny: false would admit what an error answers, so a
// mistyped or forged class would pass every limit. It is counted in
// sluice_envoy_unknown_priority_total{rule} and logged (throttled),
// without the value, which comes from the client. An empty value, or
// "default", is the default class and counted as nothing.
//
// A cost above what the class may ever use (its ceiling) is OVER_LIMIT,
// as a cost above the rule's maximum is: the store refuses either before
// it reads any state (algorithm.ErrCostTooHigh), and decide answers that
// refusal as a denial.

// classOf returns the class a descriptor of rule r naming class is
// decided as ("" for the default) and whether class is one r does not
// declare (then decided as the default). A rule the store does not
// decide has no class to decide.
func classOf(r *rules.Rule, class string) (string, bool) {
	if class == "" || class == algorithm.DefaultClass || !r.Decided() {
		return "", false
	}
	if _, ok := r.Policy.Priorities[class]; ok {
		return class, false
	}
	return "", true
}

// leaseKind is the kind folded into the pseudonym that names an
// in-flight lease (see leaseID).
const leaseKind = "envoy-lease"

// inFlight prepares d, whose rule is an in-flight one
// (rules.Rule.InFlight), from the request descriptor rd: the value
// of its last entry names the lease, which the request-time call
// acquires (one slot, whatever the hits) and the stream-done call gives
// back. Envoy sends the stream-done call (a rate_limits entry with
// apply_on_stream_done) with the descriptor's hits_addend negative
// (is_negative_hits) or 0, so either is a release. It returns the
// entries that name the subject: vars without the lease's.
func (st *State) inFlight(d *descriptor, rd *commonpb.RateLimitDescriptor, domain string, vars []rules.Entry) ([]rules.Entry, error) {
	last := vars[len(vars)-1] // the rule's descriptor has no value: its entry is a variable
	if last.Value == "" {
		return nil, errors.New("entries: the value of " + last.Key + ", which names the in-flight lease, is empty")
	}
	d.lease = leaseID(st.Pseudonymizer, domain, last.Value)
	h := rd.GetHitsAddend()
	d.release = rd.GetIsNegativeHits() || h != nil && h.GetValue() == 0
	d.cost, d.refund = 1, false
	return vars[:len(vars)-1], nil
}

// leaseID names the lease of an in-flight descriptor whose lease entry
// holds value: its pseudonym (so no raw value reaches the store), in the
// alphabet of lease ids (A-Z a-z 0-9 - _), at most 64 bytes. A key
// rotation between the two calls of one request changes the name: the
// release then finds nothing, and the lease is reclaimed after its TTL.
func leaseID(p *subject.Pseudonymizer, domain, value string) string {
	b := []byte(p.Pseudonym(leaseKind, value, domain))
	for i, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			b[i] = '-'
		}
	}
	return string(b[:min(len(b), 64)])
}

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

// prepareSettle makes d, whose rule settles (or a stream-done call with
// a limit override, which cannot), the estimate (request time)
// or the settle (stream done) of the request rd, under the evaluation id
// derived from domain, entries (the descriptor's without sluice's own)
// and the request id se carries; reqHits is the request's hits_addend.
// A request-time check (hits_addend 0) or refund (is_negative_hits)
// stays what it is.
func (st *State) prepareSettle(d *descriptor, rd *commonpb.RateLimitDescriptor, reqHits uint32, domain string, entries []rules.Entry, se ownEntries) {
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

// identity frames the entries a rule does not fix, so that no two
// different lists give the same string.
func identity(vars []rules.Entry) string { return string(appendIdentity(nil, vars)) }

// appendIdentity appends the identity of vars to b.
func appendIdentity(b []byte, vars []rules.Entry) []byte {
	for _, e := range vars {
		b = strconv.AppendInt(b, int64(len(e.Key)), 10)
		b = append(b, ':')
		b = append(b, e.Key...)
		b = strconv.AppendInt(b, int64(len(e.Value)), 10)
		b = append(b, ':')
		b = append(b, e.Value...)
	}
	return b
}
