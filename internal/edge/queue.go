package edge

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clock"
)

// A bounded queue at the edge (issue 34): a request of a rule with a
// MaxDelay that would be denied now books the next slot of its policy
// instead (sluice.Book, bounded by MaxDelay) and is held, on its own
// goroutine and a timer, with no store call, until that slot; then it
// goes on. It is refused (429) only when its slot lies past MaxDelay or
// when the rule already holds QueueLimit requests (then it is decided as
// a plain spend: admitted if it fits now). A client that goes away while
// held gives its slot back (a refund) and is answered nothing.

// Abandoned: a request held for its slot whose client went away first:
// its slot was given back, and nothing is answered (status 499, nginx's
// "client closed request", for the logs).
const Abandoned Kind = "abandoned"

// StatusClientClosed is the status an Abandoned action records.
const StatusClientClosed = 499

// What a rule's queue did with a request (Action.Queue): held until its
// slot, refused because its slot lay past MaxDelay or the queue was full,
// or given back when its client went away.
const (
	QueueWaited    = "waited"
	QueuePastDelay = "past_max_delay"
	QueueFull      = "queue_full"
	QueueAbandoned = "abandoned"
)

// DefaultQueueLimit is a rule's QueueLimit when none is set.
const DefaultQueueLimit = 1000

// queue is a rule's count of held requests.
type queue struct {
	limit int64
	held  atomic.Int64
}

// Queue gives r, a rule compiled by Rule, a bounded queue: requests that
// do not fit now wait up to maxDelay for a booked slot, at most limit (0:
// DefaultQueueLimit) held at once. r must name one gcra or token_bucket
// policy (the algorithms with a future slot to book); maxDelay is a whole
// number of ms from 1ms to the policy's MaxWait, which bounds every
// booking. at names the rule in errors.
func (c *Core) Queue(at string, r *Rule, maxDelay time.Duration, limit int) error {
	if maxDelay == 0 && limit == 0 {
		return nil
	}
	switch {
	case maxDelay <= 0 || maxDelay%time.Millisecond != 0 || maxDelay > 24*time.Hour:
		return c.OptionError(at+".MaxDelay", maxDelay, "must be a whole number of milliseconds from 1ms to 24h")
	case limit < 0:
		return c.OptionError(at+".QueueLimit", limit, "must not be negative; leave it 0 for the default, 1000")
	case len(r.Policies) != 1:
		return c.OptionError(at+".MaxDelay", maxDelay, fmt.Sprintf("a queue books a slot of one policy, not of %d (%s)", len(r.Policies), strings.Join(r.Policies, ", ")))
	}
	p, _ := c.policy(r.Policies[0])
	if p.Algorithm != sluice.GCRA && p.Algorithm != sluice.TokenBucket {
		return c.OptionError(at+".MaxDelay", maxDelay, fmt.Sprintf("policy %q is %v: only gcra and token_bucket have a future slot to book; a denial's Retry-After is its answer", p.ID, p.Algorithm))
	}
	probe := p
	probe.MaxWait = maxDelay
	if err := probe.Validate(); err != nil {
		return c.OptionError(at+".MaxDelay", maxDelay, err.Error())
	}
	if maxDelay > p.MaxWait {
		return c.OptionError(at+".MaxDelay", maxDelay, fmt.Sprintf("is more than policy %q's MaxWait (%v), which bounds every booking: raise its MaxWait", p.ID, p.MaxWait))
	}
	r.MaxDelay = maxDelay
	r.queue = &queue{limit: int64(limit)}
	if limit == 0 {
		r.queue.limit = DefaultQueueLimit
	}
	return nil
}

// Held returns how many requests r's queue holds now (0 without one).
func (r *Rule) Held() int64 {
	if r.queue == nil {
		return 0
	}
	return r.queue.held.Load()
}

// decideQueued is Decide for a rule with a queue.
func (c *Core) decideQueued(ctx context.Context, r *Rule, s Subject) Action {
	q := r.queue
	if q.held.Add(1) > q.limit {
		q.held.Add(-1)
		a := c.DecideRequest(ctx, request(sluice.Spend, r, s), r.Mode)
		if a.Kind == Limit {
			a.Queue = QueueFull
		}
		return a
	}
	defer q.held.Add(-1)
	req := request(sluice.Book, r, s)
	req.EvaluationID, req.MaxWait = "", r.MaxDelay // a book takes no id: a replay would answer a slot passed
	a := c.DecideRequest(ctx, req, r.Mode)
	o := a.Decided()
	switch {
	case a.Kind == Limit:
		a.Queue = QueuePastDelay
	case a.Kind == Admit && o.Delay > 0:
		a.Delay = o.Delay
		if clock.Sleep(c.clock, a.Delay, ctx.Done()) {
			a.Queue = QueueWaited
			break
		}
		a.Kind, a.Status, a.Queue = Abandoned, StatusClientClosed, QueueAbandoned
		lim := c.lim
		if a.Local {
			lim = c.fallback
		}
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.deadline)
		defer cancel()
		if g := lim.Check(gctx, request(sluice.Refund, r, Subject{ID: s.ID, Previous: s.Previous})); g.Kind != sluice.Allowed {
			c.Log(ctx, slog.LevelWarn, "sluice: a held request's slot not given back; it stays spent",
				slog.String("policies", strings.Join(r.Policies, ",")), slog.String("outcome", g.Kind.String()), slog.Any("error", g.Err))
		}
	}
	return a
}
