package redisstore

// The short course: the common decision (evaluation.Short: one policy, a
// spend, held or not, or a peek, a lease's acquire or release; no
// evaluation id, older subject or book) sent in short.lua's short form.
// TestShortMatchesGeneral holds it to the general course (decide and
// main) on real Redis.

import (
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/evaluation"
)

// The short decision's forms (short.lua's FAST_FORM), on Redis
// time and, in capitals, on the caller's clock: the common decision, one
// policy, a spend or a peek (a lease's acquire or release on a
// concurrency policy), no evaluation id, nothing carried, sent with its
// cost (or lease) and policy only (and on the caller's clock, now and the
// maximum regression).
var fastForms = [2][sluice.Renew + 1]any{
	{sluice.Spend: "s", sluice.Peek: "p", sluice.Acquire: "a", sluice.Release: "r"},
	{sluice.Spend: "S", sluice.Peek: "P", sluice.Acquire: "A", sluice.Release: "R"},
}

// fastHeld is the short form of a held spend (FAST_FORM.HELD), on Redis time
// and on the caller's clock: a spend's, its hold after the cost.
var fastHeld = [2]any{"h", "H"}

// decideShort runs the script once for subject: ev's decision in the
// short form (see short.lua); all and bounds are evaluate's.
func (s *Store) decideShort(ctx context.Context, subject string, ev *sluice.Evaluation, dst []int64, all bool, bounds func(*sluice.Policy) [4]int64) ([]int64, error) {
	return s.send(ctx, s.shortPending(subject, ev, bounds), ev, dst, all)
}

// shortPending returns the pending decision that decideShort sends: ev's
// for subject in the short form.
func (s *Store) shortPending(subject string, ev *sluice.Evaluation, bounds func(*sluice.Policy) [4]int64) *pending {
	pol := ev.Policies[0]
	nargv, clocked, held := 3, 0, 0
	if s.clock != nil {
		nargv, clocked = 5, 1
	}
	if ev.Hold != 0 {
		nargv, held = nargv+1, 1
	}
	p := pendingPool.Get().(*pending)
	p.state.Store(queued)
	args := slices.Grow(p.args[:0], 4+nargv)[:4+nargv]
	p.args, p.keys, p.alone = args, 1, false
	cmdName, code := s.call()
	p.key.b = s.appendKey(p.key.b[:0], subject, pol)
	args[0], args[1], args[2], args[3] = cmdName, code, smallInts[1], &p.key
	argv := args[3:] // argv[i] is ARGV[i]
	argv[1] = fastForms[clocked][ev.Op]
	if pol.Algorithm == sluice.Concurrency {
		p.lease.s = ev.LeaseID
		argv[2] = &p.lease
	} else {
		argv[2] = intArg(ev.Cost)
	}
	if held != 0 {
		argv[1], argv[3] = fastHeld[clocked], holdArg(ev.Hold)
	}
	if s.clock != nil {
		argv[3+held], argv[4+held] = strconv.FormatInt(evaluation.Now(s.clock), 10), s.maxReg
	}
	pa := s.argsOf(pol, evaluation.Reserve(pol, ev.Priority, evaluation.Op(ev)), bounds)
	argv[nargv] = pa.arg
	if s.clock == nil {
		// In a decideAll call it goes by its spec (batch.lua), a lease's
		// beside it.
		p.spec, p.limit = shortSpec(pa, ev.Op, ev.Cost, ev.Hold), pa.limit
	}
	return p
}

// shortSpec returns the spec (batch.lua, short.lua's specOf) of a short
// decision of op (a spend or a peek; on a concurrency policy an acquire or
// a release, whose lease goes beside the spec) with cost, held for hold,
// under the policy of a on Redis time: its form, cost, hold in µs and the
// policy's argument, joined by spaces.
func shortSpec(a *policyArgs, op sluice.Op, cost int64, hold time.Duration) string {
	switch {
	case op == sluice.Spend && cost == 1 && hold == 0:
		return a.spend1
	case op == sluice.Acquire:
		return a.leases[0]
	case op == sluice.Release:
		return a.leases[1]
	}
	form := fastForms[0][op].(string)
	if hold != 0 {
		form = fastHeld[0].(string)
	}
	return form + " " + strconv.FormatInt(cost, 10) + " " + strconv.FormatInt(hold.Microseconds(), 10) + " " + a.text
}
