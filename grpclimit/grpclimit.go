// Package grpclimit is sluice's gRPC server middleware: unary and stream
// server interceptors over a sluice.Limiter. For each call it picks the
// method's policies, resolves who is calling (by default the peer
// address; the address behind trusted proxies, a metadata value such as
// an API key, or the authenticated principal where configured), turns
// that into a pseudonym, asks the Limiter within a deadline, and answers:
//
//   - allowed: the call goes on; its trailer carries the RateLimit-Policy
//     and RateLimit fields of draft-ietf-httpapi-ratelimit-headers, as
//     metadata "ratelimit-policy" and "ratelimit";
//   - denied: codes.ResourceExhausted, with a google.rpc.RetryInfo detail
//     whose retry delay is the wait until the same call would be admitted
//     (never less), a google.rpc.QuotaFailure detail naming the policies
//     that denied, and the same trailer;
//   - undecidable (store down, deadline passed, reply lost, corrupt
//     state): per the method's failure mode, codes.Unavailable with a
//     RetryInfo of one second (closed), the call goes on (open), or a
//     local limiter holding a share of each limit decides (local, see
//     Options.Fallback).
//
// A method whose policies include a Concurrency policy holds a lease for
// the life of the call, a stream's included: acquired before the handler
// runs, released when it returns, when the client cancels (the handler
// sees its context done and returns) and when it panics (the lease is
// released, then the panic goes on to the interceptors outside, e.g. a
// recovery interceptor). grpclimit does not renew leases: set the
// policy's LeaseTTL above the longest call, or a stream that outlives it
// frees its slot early.
//
// The raw identity (a principal, an API key, an address) is only ever
// hashed: it never reaches the Limiter or a log line.
//
// Who a call is limited as is a subject.KeyFunc, the one key function of
// every edge (httplimit takes the same): the call is seen as the HTTP/2
// request it is, its metadata as Header and its peer as RemoteAddr, so
// subject.ClientIP (the address behind trusted proxies, read from
// "x-forwarded-for" or "forwarded" metadata only when the peer is one of
// them), subject.Header ("x-api-key" metadata), subject.Principal (what
// an authentication interceptor installed before grpclimit's put in
// r.Context()) and subject.FirstOf serve both.
//
// For services that already chain go-grpc-middleware's ratelimit
// interceptor, Interceptors has its Limiter's one method, Limit.
//
// Every invalid option is an error at construction, naming the option,
// its value and the rule it breaks.
package grpclimit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/edge"
	"github.com/sluicehq/sluice/subject"
)

// defaultOperation is the operation of the calls no Method rule matches
// and Options.Default limits.
const defaultOperation = "*"

// Method selects the policies of the calls it matches.
type Method struct {
	// Name is a full method name, matched exactly, e.g.
	// "/acme.Orders/Create", or a service followed by "/", matching every
	// method of the service, e.g. "/acme.Orders/". An exact name wins over
	// its service. Name is also the operation every subject is scoped
	// to: the methods of one service rule share its budgets. Required.
	Name string
	// Policies are the IDs of the Limiter's policies a call spends, all or
	// nothing. At least one is required.
	Policies []string
	// Cost is the number of units one call spends, e.g. 5 for an
	// expensive query; at most every rate policy's MaxCost. A
	// concurrency policy takes one slot whatever the cost. Default: 1.
	Cost int64
	// Subject says who the method's calls are limited as.
	// Default: nil, Options.Subject.
	Subject subject.KeyFunc
	// FailureMode answers the method's calls when the Limiter cannot
	// decide: failure.Closed (codes.Unavailable), failure.Open (the
	// call goes on, logged) or failure.Local (the local fallback
	// decides, see Options.Fallback). Default: FailClosed.
	FailureMode failure.Mode
	// SettleTrailer, when set, is the trailer metadata key in which the
	// handler reports what a call really cost (grpc.SetTrailer, or the
	// stream's SetTrailer), e.g. "x-tokens-used": the method then spends
	// Cost as a sluice.Estimate, and once the handler returns (having
	// panicked too) settles it with that value, giving back the
	// difference or charging the excess past the limit. A missing or
	// malformed value (not a decimal integer of 0 or more), or a panic,
	// settles at the estimate; one above 1e9, the most a settle takes,
	// settles as 1e9. The method's policies must take estimates
	// (fixed_window, sliding_log, token_bucket, gcra); their DedupeTTL is
	// how long an estimate waits for its settle. Limit cannot settle: use
	// Unary and Stream. Default: "", a plain spend.
	SettleTrailer string
	// Priority is the priority class the method's calls are decided as
	// (sluice.Request.Priority), e.g. "sheddable": one a policy of the
	// method declares (Policy.Priorities), checked by New. Default: "",
	// the class "default".
	Priority string
	// PriorityFunc, when set, picks a call's class instead from its
	// context (its metadata, its peer) and full method name, e.g. from
	// metadata only a trusted gateway sets (never what any client may
	// set). "" falls back to Priority; a class the method's policies do not
	// declare is answered as the Limiter answers an Incompatible call.
	// Default: nil.
	PriorityFunc func(ctx context.Context, fullMethod string) string
	// MaxDelay, when set, holds a call that would be denied for up to
	// this long instead: it books the next slot of the method's one
	// policy (gcra or token_bucket: sluice.Book) and goes on at that
	// slot, with no store call while it waits; it is refused only when
	// its slot lies further ahead, or when QueueLimit calls are already
	// held (then it is decided as a plain spend). A call canceled while
	// held gives its slot back (codes.Canceled). A whole number of ms,
	// 1ms to the policy's MaxWait (which bounds every booking); not with
	// SettleTrailer. Default: 0, refused at once.
	MaxDelay time.Duration
	// QueueLimit is the most calls the method holds at once for their
	// slots (MaxDelay). Default: 1000.
	QueueLimit int
}

// Options configure the interceptors. The zero value means the defaults.
type Options struct {
	// Methods select policies per call by its full method name. Default:
	// none, every call gets Default.
	Methods []Method
	// Default are the policy IDs of the calls no Method rule matches,
	// under operation "*", at a cost of 1. Default: none, such calls go
	// on unlimited and without trailer fields.
	Default []string
	// FailureMode is Default's failure mode (see Method.FailureMode).
	// Default: failure.Closed.
	FailureMode failure.Mode
	// Subject says who a call is limited as, for the rules that do not
	// say it themselves. Default: subject.ClientIP(nil), the peer's
	// address.
	Subject subject.KeyFunc
	// PassAnonymous lets calls that Subject does not identify go on,
	// unlimited, so that the service's own authentication answers them.
	// Default: false, they are answered codes.Unauthenticated without
	// asking the Limiter.
	PassAnonymous bool
	// Pseudonymizer turns (kind, identity, operation) into the subject
	// the Limiter sees. Default: subject.Unkeyed(), whose pseudonyms
	// anyone can recompute from a guessed identity: configure a keyed one
	// (subject.New) in production.
	Pseudonymizer *subject.Pseudonymizer
	// Deadline bounds how long one call waits for the Limiter (and a
	// lease's release); past it the outcome is Unavailable and the
	// failure mode answers. Default: 500ms.
	Deadline time.Duration
	// Fallback is the store of the local fallback, typically a
	// memstore.Store of this process that the caller owns and closes:
	// when the Limiter cannot decide, the calls of a method whose
	// FailureMode is FailLocal are decided on it, under the same policy
	// IDs, each policy holding LocalShare of its limit. Required when a
	// method fails local. Default: nil.
	Fallback sluice.Store
	// LocalShare is the share of each policy's limit the local fallback
	// holds, in (0, 1] (see httplimit.Options.LocalShare). Default: 1.
	LocalShare float64
	// Logger receives a record, at Warn, when the Limiter cannot decide
	// or a lease cannot be released: at most one a second, with the count
	// held back. Records carry the pseudonym, never the identity.
	// Default: slog.Default().
	Logger *slog.Logger
}

// Interceptors limit the calls of a gRPC server: Unary and Stream give
// the interceptors to install, Limit serves go-grpc-middleware's
// ratelimit interceptor. Create them with New; the zero value is not
// usable. Immutable and safe for concurrent use; they own no goroutines
// (close the Limiter's store yourself).
type Interceptors struct {
	core          *edge.Core
	exact         map[string]*rule
	services      map[string]*rule // by "/service/"
	fallthru      *rule            // Options.Default, or nil
	pseudo        *subject.Pseudonymizer
	passAnonymous bool
}

// rule is a Method (or Options.Default) checked and ready to decide.
type rule struct {
	*edge.Rule
	operation string
	subject   subject.KeyFunc
	settle    string // Method.SettleTrailer, lower case
	priority  string // Method.Priority
	classOf   func(ctx context.Context, fullMethod string) string
}

// New validates opts against limiter and returns the interceptors. The
// error names the option, its value and the rule it breaks, e.g.
//
//	grpclimit: Methods[0].Policies[0] = "ordrs": the limiter has no such policy; it has orders, search
func New(limiter *sluice.Limiter, opts Options) (*Interceptors, error) {
	if limiter == nil {
		return nil, errors.New("grpclimit: limiter is nil")
	}
	in := &Interceptors{
		exact:         map[string]*rule{},
		services:      map[string]*rule{},
		pseudo:        cmp.Or(opts.Pseudonymizer, subject.Unkeyed()),
		passAnonymous: opts.PassAnonymous,
	}
	var err error
	if in.core, err = edge.New(limiter, edge.Options{
		Fallback: opts.Fallback, LocalShare: opts.LocalShare, Deadline: opts.Deadline, Logger: opts.Logger, Prefix: "grpclimit",
	}); err != nil {
		return nil, err
	}
	subj := opts.Subject
	if subj == nil {
		subj = subject.ClientIP(nil)
	}
	for i, m := range opts.Methods {
		at := fmt.Sprintf("Methods[%d]", i)
		service, err := checkName(at, m.Name)
		if err != nil {
			return nil, err
		}
		index := in.exact
		if service {
			index = in.services
		}
		if _, dup := index[m.Name]; dup {
			return nil, optionError(at+".Name", fmt.Sprintf("%q", m.Name), "is named by an earlier rule too")
		}
		r, err := in.compile(at, m, subj)
		if err != nil {
			return nil, err
		}
		index[m.Name] = r
	}
	if len(opts.Default) > 0 {
		r, err := in.compile("Default", Method{Name: defaultOperation, Policies: opts.Default, FailureMode: opts.FailureMode}, subj)
		if err != nil {
			return nil, err
		}
		in.fallthru = r
	}
	return in, nil
}

// optionError is an invalid option: where it is, its value and the rule
// it breaks.
func optionError(at string, value any, rule string) error {
	return fmt.Errorf("grpclimit: %s = %v: %s", at, value, rule)
}

// checkName checks a Method's Name, found at at, and reports whether it
// names a whole service ("/acme.Orders/") rather than one method.
func checkName(at, name string) (service bool, err error) {
	svc, method, ok := strings.Cut(strings.TrimPrefix(name, "/"), "/")
	switch {
	case !strings.HasPrefix(name, "/") || !ok || svc == "" || strings.Contains(method, "/"):
		return false, optionError(at+".Name", fmt.Sprintf("%q", name), `must be a full method name such as "/acme.Orders/Create", or a service such as "/acme.Orders/"`)
	case strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r > '~' }):
		return false, optionError(at+".Name", fmt.Sprintf("%q", name), "must be printable ASCII without spaces")
	}
	return method == "", nil
}

// compile checks m, found at at, against the limiter; subj is
// Options.Subject.
func (in *Interceptors) compile(at string, m Method, subj subject.KeyFunc) (*rule, error) {
	r := &rule{operation: m.Name, subject: m.Subject}
	if m.Subject == nil {
		r.subject = subj
	}
	var err error
	if r.Rule, err = in.core.Rule(at, m.Policies, m.Cost, m.FailureMode); err != nil {
		return r, err
	}
	if err := in.core.Class(at+".Priority", r.Rule, m.Priority); err != nil {
		return r, err
	}
	r.priority, r.classOf = m.Priority, m.PriorityFunc
	if m.MaxDelay != 0 || m.QueueLimit != 0 {
		if m.SettleTrailer != "" {
			return r, optionError(at+".MaxDelay", m.MaxDelay.String(), "a held call books a plain slot: not with SettleTrailer")
		}
		if err := in.core.Queue(at, r.Rule, m.MaxDelay, m.QueueLimit); err != nil {
			return r, err
		}
	}
	if m.SettleTrailer == "" {
		return r, nil
	}
	return r, in.settles(at, r, m.SettleTrailer)
}

// ruleOf returns the rule of the full method name method: its exact
// rule, else its service's, else Options.Default's; nil when none limits
// it.
func (in *Interceptors) ruleOf(method string) *rule {
	if r, ok := in.exact[method]; ok {
		return r
	}
	if i := strings.LastIndexByte(method, '/'); i > 0 {
		if r, ok := in.services[method[:i+1]]; ok {
			return r
		}
	}
	return in.fallthru
}
