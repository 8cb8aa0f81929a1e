package sluice

import "context"

// A stage is one step of a Limiter's Check between validation and the
// store: it sees the decision in flight and calls next to take it further
// (once, more than once, or not at all when it answers itself), and may
// read what next left in d.o on the way back. Each feature that acts on
// decisions is one stage in a file of its own, in the order Limiter.stages
// gives: overrides (the subject's own numbers), the near cache (a
// remembered denial), local quota (admit from a block, or send a held
// spend), tracing; the store is last. A new capability is a stage beside
// these, not a branch in Check.
type stage func(ctx context.Context, d *decision, next step)

// A step takes d from one point of the pipeline to its end.
type step func(ctx context.Context, d *decision)

// decision is one Check in flight: the Evaluation the store gets, and the
// Outcome it comes to. Pooled by the Limiter.
type decision struct {
	ev   Evaluation
	o    Outcome // set by the store step, or by a stage answering itself
	many bool    // the request named Policies: the Outcome carries Statuses
}

// chain returns the step that runs stages in order, then last.
func chain(stages []stage, last step) step {
	next := last
	for i := len(stages) - 1; i >= 0; i-- {
		s, n := stages[i], next
		next = func(ctx context.Context, d *decision) { s(ctx, d, n) }
	}
	return next
}

// evaluate is the last step: the store decides d.ev, and outcomeOf maps
// its answer to d.o.
func (l *Limiter) evaluate(ctx context.Context, d *decision) {
	err := l.store.Evaluate(ctx, &d.ev)
	outcomeOf(&d.o, &d.ev, err, d.many)
}
