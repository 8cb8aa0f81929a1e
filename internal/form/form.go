// Package form carries the Limiter's one decision on a decision's form,
// short or general, from package sluice, which records it on the
// Evaluation in a field of its own (unexported: the public surface gains
// no name), to the stores below it, which cannot read that field; and
// the shape of its answer, which Status speaks for several, to the Envoy
// service, which makes that choice across checks. Package sluice sets
// the functions when it is initialized, and nothing else does; a store
// reads the form through evaluation.Short.
package form

var (
	// Short reports whether ev, a *sluice.Evaluation, is in the short
	// form: the Limiter's validation recorded so.
	Short func(ev any) bool
	// Record records on ev, a *sluice.Evaluation, the form the Limiter's
	// validation gives it, by the one predicate: a test builds a short
	// Evaluation by hand with it (one built without it is general).
	Record func(ev any)
	// MostRestrictive returns the index of the status of statuses, a
	// []sluice.Status of at least one, that speaks for them all: package
	// sluice's choice of an Outcome's Status among its Statuses, for the
	// Envoy service's answer across the checks of one request.
	MostRestrictive func(statuses any) int
)
