package rules

import (
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/evaluation"
)

// Costs settled on stream done (Rule.Settles): a rule with
// sluice_settle: true spends, at request time, an estimate (the
// descriptor's hits_addend) and Envoy's stream-done call replaces it by
// the actual cost (that call's hits_addend, e.g. the tokens an LLM
// upstream reported in its response metadata). Both calls carry the
// request id as an entry of key RequestIDKey (a request_headers action
// on x-request-id); the stream-done call also carries an entry of key
// StreamDoneKey (a generic_key action), whatever its value. The service
// removes both entries before matching, so the rules file names neither
// and the rule is written as any other.

// SettleKey is the rate_limit key that makes a rule settle its cost on
// stream done: sluice_settle: true. Its "sluice_" prefix keeps an
// envoyproxy/ratelimit file from meaning it by accident.
const SettleKey = "sluice_settle"

// RequestIDKey is the descriptor key of the entry carrying the request
// id, which names the estimate both calls of one request share.
const RequestIDKey = "sluice_request_id"

// StreamDoneKey is the descriptor key of the entry marking Envoy's
// stream-done call (apply_on_stream_done) of a settling rule.
const StreamDoneKey = "sluice_stream_done"

// settles checks a rule that sets sluice_settle (m being its rate_limit
// block) against pol, the policy built for it, and makes pol remember
// estimates as long as a stream may last: a sliding_window cannot give
// back exactly what a settle returns. (unlimited, sluice_in_flight and
// requests_per_unit 0 refuse the key themselves.)
func (p *parser) settles(path string, m map[string]*yaml.Node, r *Rule, pol *sluice.Policy) {
	if !r.Settles {
		return
	}
	if pol.Algorithm == sluice.SlidingWindow {
		p.add(p.errorf(path+"."+SettleKey, m[SettleKey], "applies only to fixed_window, sliding_log, token_bucket and gcra: a sliding_window cannot give back exactly what a settle returns"))
		return
	}
	pol.DedupeTTL, pol.DedupeMax = SettleDeadline, SettleMax
	if pol.Validate() != nil {
		return // reported by the caller, at the field at fault
	}
	// What else the engine refuses of an estimate (a bucket whose debt
	// would pass 2^53 µs), refused here rather than on every request.
	if err := evaluation.CheckEstimate(*pol, 1); err != nil {
		p.add(p.errorf(path+"."+SettleKey, m[SettleKey], "cannot settle this rule: %v", err))
	}
}

// SettleDeadline is how long a settling rule's store remembers an
// estimate (its policy's DedupeTTL, the longest a policy takes): a stream
// done later settles nothing, and its estimate stays spent. SettleMax is
// how many estimates of one subject it remembers at once (DedupeMax, the
// most a policy takes): past it the oldest is forgotten first.
const (
	SettleDeadline = time.Hour
	SettleMax      = 10000
)
