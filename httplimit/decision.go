package httplimit

import (
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
)

// The values of Decision.Action.
const (
	actionAdmitted     = "admitted"
	actionLimited      = "limited"
	actionFailedClosed = "failed_closed"
	actionFailedOpen   = "failed_open"
	actionNoSubject    = "no_subject"
)

// Decision is what the middleware did with one request, as handed to
// Options.OnDecision and found by FromContext. It holds the pseudonym,
// never the identity. Its fields are bounded enough for metric labels
// except Subject and EvaluationID.
type Decision struct {
	// Operation is the route's operation, e.g. "POST /login", or "*" for
	// Options.Default.
	Operation string
	// Policies are the route's policy IDs. Do not modify.
	Policies []string
	// SubjectKind is the kind of the identity, e.g. "api_key" (see
	// subject.KeyFunc); "" when there is none (Action "no_subject").
	SubjectKind string
	// Subject is the pseudonym the limiter saw, e.g. "k1:3q2-7w…"; "" when
	// none. Never a metric label: it is unbounded.
	Subject string
	// Cost is the number of units the request asked for: the route's
	// Cost, e.g. 1.
	Cost int64
	// EvaluationID is the digest of the request's idempotency key (see
	// Options.IdempotencyKeyHeader), e.g. "ik:Qm9…"; "" when none.
	EvaluationID string
	// Priority is the request's priority class (Route.Priority or
	// Route.PriorityFunc), e.g. "sheddable"; "" for the default.
	Priority string
	// Action is what the outcome calls for, in its log and metric
	// spelling:
	//   - "admitted": the limiter (or the local fallback) admitted the
	//     request;
	//   - "limited": it denied it: 429;
	//   - "failed_closed": no decision, and the route fails closed (or the
	//     local fallback failed too): 503;
	//   - "failed_open": no decision, and the route fails open: the
	//     request goes on;
	//   - "no_subject": the route's subject.KeyFunc identified no one: 403,
	//     or the request goes on with Options.PassAnonymous. The limiter
	//     was not asked;
	//   - "abandoned": the request was held for its slot (Route.MaxDelay)
	//     and its client went away first: the slot was given back and
	//     nothing answered (Status 499).
	Action string
	// Shadow reports that the route is in shadow mode and Action was not
	// enforced: a limited, failed_closed or no_subject request went on.
	Shadow bool
	// Status is the status the middleware answers with, e.g. 429 (or
	// Options.Deny answers in its place); 0 when the request went on to
	// the next handler.
	Status int
	// Outcome is the main limiter's outcome; its Kind tells a lost reply
	// (Indeterminate) from a refusal to try or corrupt state (Unavailable,
	// with its Cause). Zero for no_subject.
	Outcome sluice.Outcome
	// Local reports that the main limiter could not decide and the local
	// fallback was asked; LocalOutcome is its answer.
	Local        bool
	LocalOutcome sluice.Outcome
	// Waited is how long the request was held for its booked slot
	// (Route.MaxDelay) before it went on, e.g. 120ms; 0 when it was not.
	Waited time.Duration
	// Queue is what the route's queue did with the request: "waited"
	// (held, then on), "past_max_delay" (its slot lay past MaxDelay:
	// 429), "queue_full" (QueueLimit requests were held: decided as a
	// plain spend, 429 here) or "abandoned"; "" when it fit now or the
	// route has no queue.
	Queue string

	previous []string // the subject under older keys during a key rotation
}

func (m *Middleware) record(r *http.Request, d *Decision) {
	if m.onDecision != nil {
		m.onDecision(r, *d)
	}
	level := slog.LevelDebug
	switch {
	case d.Action == actionFailedClosed || d.Action == actionFailedOpen || d.Local:
		level = slog.LevelWarn
	case d.Shadow || d.Action == actionNoSubject:
		level = slog.LevelInfo
	}
	ctx := r.Context()
	if !m.log.Enabled(ctx, level) {
		return
	}
	// Store failures fail every request while they last: the core logs
	// one line a second, with the count of those held back.
	attrs := make([]slog.Attr, 0, 13)
	attrs = append(attrs,
		slog.String("operation", d.Operation),
		slog.String("policies", strings.Join(d.Policies, ",")),
		slog.String("action", d.Action),
		slog.String("subject_kind", d.SubjectKind),
		slog.String("subject", d.Subject),
	)
	if d.Shadow {
		attrs = append(attrs, slog.Bool("shadow", true))
	}
	if d.Status != 0 {
		attrs = append(attrs, slog.Int("status", d.Status))
	}
	attrs = appendOutcome(attrs, "", d.Outcome)
	if d.Local {
		attrs = appendOutcome(attrs, "local_", d.LocalOutcome)
	}
	msg := "rate limit decision"
	if d.Shadow {
		msg = "rate limit decision (shadow: not enforced)"
	}
	m.core.Log(ctx, level, msg, attrs...)
}

func appendOutcome(attrs []slog.Attr, prefix string, o sluice.Outcome) []slog.Attr {
	if o.Kind == 0 {
		return attrs
	}
	attrs = append(attrs, slog.String(prefix+"outcome", o.Kind.String()))
	switch o.Kind {
	case sluice.Allowed, sluice.Denied:
		attrs = append(attrs,
			slog.String(prefix+"policy", o.Policy),
			slog.Int64(prefix+"remaining", o.Remaining),
			slog.Duration(prefix+"retry_after", o.RetryAfter),
		)
	default:
		if o.Cause != 0 {
			attrs = append(attrs, slog.String(prefix+"cause", o.Cause.String()))
		}
		attrs = append(attrs, slog.Any(prefix+"reason", o.Err))
	}
	return attrs
}
