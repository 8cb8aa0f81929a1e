package rls

import (
	"context"
	"log/slog"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/envoy/rules"
)

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

// countUnknownClasses counts and logs every descriptor of ds that named
// a class its rule does not declare.
func (s *Service) countUnknownClasses(ctx context.Context, ds []descriptor) {
	for i := range ds {
		d := &ds[i]
		if !d.unknownClass || d.rule == nil {
			continue
		}
		rule := rules.PolicyID(d.rule.Key)
		if d.override {
			rule = OverrideRule
		}
		if s.metrics != nil {
			s.metrics.unknownPriority.WithLabelValues(rule).Inc()
		}
		if d.core != nil {
			d.core.Log(ctx, slog.LevelWarn, "envoy rate limit: a priority class the rule does not declare; decided as the default class", slog.String("rule", d.rule.Key), slog.String("key", rules.PriorityKey))
		}
	}
}
