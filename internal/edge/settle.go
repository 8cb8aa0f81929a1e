package edge

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine/algorithm"
)

// Estimate → settle at the edges: a rule whose cost is known only once
// the request is served (the tokens an LLM upstream used) spends its Cost
// as a sluice.Estimate (Rule.Estimates), under an evaluation id
// (SettleID), and the edge settles it with the actual cost when the
// request is done (Core.Settle): httplimit and the proxy read it from a
// response header or trailer the handler or upstream sets (ParseCost).

// Estimates makes r spend its Cost as an estimate, to be settled by
// Core.Settle; at names the rule in errors. A rule that names a
// concurrency policy cannot (a lease has no cost to settle), nor one
// naming a sliding_window policy (it cannot give back exactly).
func (c *Core) Estimates(at string, r *Rule) error {
	if r.Op == sluice.Acquire {
		return c.OptionError(at+".Policies", fmt.Sprintf("%q", r.Lease), "is a concurrency policy: a rule that settles its cost names rate policies only")
	}
	for j, id := range r.Policies {
		if p, _ := c.policy(id); p.Algorithm == sluice.SlidingWindow {
			return c.OptionError(fmt.Sprintf("%s.Policies[%d]", at, j), fmt.Sprintf("%q", id), "is a sliding_window policy: it cannot give back exactly what a settle returns; use fixed_window, sliding_log, token_bucket or gcra")
		}
	}
	r.Op = sluice.Estimate
	return nil
}

// SettleID returns the evaluation id of an estimate: s's own (a client's
// idempotency key), or a random one.
func SettleID(s Subject) string {
	if s.EvaluationID != "" {
		return s.EvaluationID
	}
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand's contract since Go 1.24)
	return "st:" + base64.RawURLEncoding.EncodeToString(b[:])
}

// ParseCost reads an actual cost as a handler or an upstream reports it:
// a decimal integer of 0 or more; one past int64 reads as math.MaxInt64
// (Settle caps it). ok is false for anything else (absent included): the
// edge then settles at the estimate.
func ParseCost(v string) (cost int64, ok bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if errors.Is(err, strconv.ErrRange) && n > 0 {
		return n, true // math.MaxInt64: huge, not malformed
	}
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// Settle replaces the estimate a's admission of rule r spent for s (under
// s.EvaluationID, the id it was spent with) by cost, the actual one, on
// the limiter that admitted it, with a deadline of its own (the request's
// context may be canceled already), and counts it (Options.Settled). A
// cost above the most a settle takes (algorithm.MaxLimit, past which the
// store refuses it) is settled as that most: a huge report charges as
// much as any, never less than the estimate. A settle the store could
// not take is logged (throttled): the estimate then stays spent. An
// action that admitted nothing settles nothing.
func (c *Core) Settle(ctx context.Context, r *Rule, a *Action, s Subject, cost int64) sluice.Outcome {
	if a.Kind != Admit || r.Op != sluice.Estimate {
		return sluice.Outcome{Kind: sluice.Incompatible, Err: fmt.Errorf("%s: %w: %w", c.prefix, errNothingSpent, sluice.ErrInvalidRequest)}
	}
	lim := c.lim
	if a.Local {
		lim = c.fallback
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.deadline)
	defer cancel()
	req := request(sluice.Settle, r, s)
	req.Cost = min(cost, algorithm.MaxLimit)
	o := lim.Check(sctx, req)
	c.countSettle(ctx, &req, o)
	if o.Kind != sluice.Allowed {
		c.Log(ctx, slog.LevelWarn, "sluice: estimate not settled; it stays spent until its deadline (dedupe_ttl) passes",
			slog.String("policies", strings.Join(r.Policies, ",")), slog.Int64("cost", req.Cost),
			slog.String("outcome", o.Kind.String()), slog.Any("error", o.Err))
	}
	return o
}

// countSettle counts o, the outcome of the settle req, on the Core's
// settle counter and the context's, if any (WithSettled).
func (c *Core) countSettle(ctx context.Context, req *sluice.Request, o sluice.Outcome) {
	f, _ := ctx.Value(settledKey{}).(CountFunc)
	if c.settled == nil && f == nil {
		return
	}
	ids := req.Policies
	if req.Policy != "" {
		ids = []string{req.Policy}
	}
	for _, count := range []CountFunc{c.settled, f} {
		if count != nil {
			count(ids, nil, o)
		}
	}
}

type settledKey struct{}

// WithSettled returns ctx carrying f: every settle a Core takes under it
// is also counted by f (the server's proxy counts the settles of the
// httplimit middleware it wraps so, as WithCount its decisions).
func WithSettled(ctx context.Context, f CountFunc) context.Context {
	return context.WithValue(ctx, settledKey{}, f)
}
