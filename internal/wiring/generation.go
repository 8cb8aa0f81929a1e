package wiring

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/edge"
	"github.com/sluicehq/sluice/internal/envoy/rlqs"
	"github.com/sluicehq/sluice/internal/envoy/rls"
	"github.com/sluicehq/sluice/internal/envoy/rules"
	"github.com/sluicehq/sluice/internal/policyerr"
	"github.com/sluicehq/sluice/subject"
)

// Generation is what one configuration decides with: its Limiters, the
// pseudonymizer of its subjects, its overrides and failure modes, and
// the Envoy service's state. sluice serve builds one per reload; the
// listeners, the APIs and the proxy's HTTP side around it are the
// server's.
type Generation struct {
	// Limiter holds the config's own policies, with its overrides; with
	// none (an envoy section only), the rules files' Limiter. nil when
	// neither has a policy that needs the store.
	Limiter *sluice.Limiter
	// Envoy holds exactly the rules files' policies (local quota on when
	// envoy.local_quota says so); nil without an envoy section or when
	// no rule needs the store (every rule unlimited or 0).
	Envoy *sluice.Limiter
	// Pseudonymizer digests subjects with subjects.hmac_keys (unkeyed,
	// with a warning logged, without keys).
	Pseudonymizer *subject.Pseudonymizer
	// Overrides are the config's overrides, their subjects pseudonymized
	// as the check API's ("api").
	Overrides []sluice.Override
	// FailureModes are every policy's failure mode by ID: the config's
	// failure_mode, then the rules files' rules'.
	FailureModes map[string]failure.Mode
	// Core is the check API's edge core, deciding with Limiter: it counts
	// every spending decision (Count) and bounds each by
	// server.decision_timeout.
	Core *edge.Core
	// RLS is the Envoy rate-limit service's state, with its edge core
	// deciding with Envoy; nil without an envoy section.
	RLS *rls.State
	// RLQS is Envoy's quota service's config; nil without envoy.rlqs.
	// Its buckets' plans are among Limiter's overrides.
	RLQS *rlqs.Config
}

// BuildOptions are what a generation is built with besides its config.
type BuildOptions struct {
	// Store is the store every Limiter decides on (serve's, instrumented).
	// Required.
	Store sluice.Store
	// Clock is the Limiters' clock (local quota's blocks). Default: the
	// Limiter's.
	Clock sluice.Clock
	// Getenv reads subjects.hmac_keys' variables. Default: none is set.
	Getenv func(string) string
	// Log receives the warning about missing HMAC keys. Default: none.
	Log *slog.Logger
	// TracerProvider, when set, traces every decision. Default: nil.
	TracerProvider trace.TracerProvider
	// OnLocalQuota, when set, is every Limiter's
	// sluice.Options.OnLocalQuota: it counts what local quota did
	// (sluice_local_quota_*). Default: none.
	OnLocalQuota func(policy string, local, blocks, units, unused int64)
	// Count, when set, counts every spending decision the generation's
	// edge cores take (sluice_decisions_total). Default: none.
	Count edge.CountFunc
	// Settled, when set, counts every settle of an estimate the
	// generation's edge cores take (sluice_settled_units_total).
	// Default: none.
	Settled edge.CountFunc
}

// Build turns cfg and its Envoy rules files (rules; nil without an envoy
// section) into a Generation. It is the one place where a configuration's
// Limiters are made.
func Build(cfg *config.Config, rules *rules.Config, o BuildOptions) (*Generation, error) {
	if o.Getenv == nil {
		o.Getenv = func(string) string { return "" }
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	pseud, err := pseudonymizer(cfg, o.Getenv, o.Log)
	if err != nil {
		return nil, err
	}
	g := &Generation{Pseudonymizer: pseud, FailureModes: failureModes(cfg, rules)}
	envoyOverrides, err := EnvoyOverrides(cfg, rules, pseud)
	if err != nil {
		return nil, err
	}
	if rules != nil {
		if ps := envoyPolicies(rules, cfg.Envoy.LocalQuota); len(ps) > 0 {
			if g.Envoy, err = sluice.New(o.Store, ps, sluice.Options{TracerProvider: o.TracerProvider, Overrides: envoyOverrides, Clock: o.Clock, OnLocalQuota: o.OnLocalQuota}); err != nil {
				return nil, fmt.Errorf("envoy rules: %w", err)
			}
		}
	}
	// A config with only an envoy section has no policies of its own: the
	// check API, metrics and dashboard then answer for the rules files'
	// policies (none when no rule needs the store).
	g.Limiter = g.Envoy
	proxyOverrides, err := ProxyOverrides(cfg, pseud)
	if err != nil {
		return nil, err
	}
	apiOverrides := append(cfg.SluiceOverrides(func(raw string) string { return pseud.Pseudonym("api", raw, "") }), proxyOverrides...)
	apiOverrides = append(apiOverrides, rlqsOverrides(cfg, pseud)...)
	g.RLQS = RLQS(cfg)
	g.Overrides = append(apiOverrides, envoyOverrides...)
	if len(cfg.Policies) > 0 {
		if g.Limiter, err = sluice.New(o.Store, cfg.SluicePolicies(), sluice.Options{TracerProvider: o.TracerProvider, Overrides: apiOverrides, Clock: o.Clock, OnLocalQuota: o.OnLocalQuota}); err != nil {
			return nil, err
		}
	}
	if err := g.cores(cfg, rules, o); err != nil {
		return nil, err
	}
	return g, nil
}

// cores builds g's edge cores: the check API's, and with rules the Envoy
// service's state and core.
func (g *Generation) cores(cfg *config.Config, rules *rules.Config, o BuildOptions) error {
	var err error
	deadline := cmp.Or(cfg.Server.DecisionTimeout, config.DefaultDecisionTimeout)
	if g.Core, err = edge.New(g.Limiter, edge.Options{Deadline: deadline, Count: o.Count, Settled: o.Settled, Clock: o.Clock, Logger: o.Log, Prefix: "server"}); err != nil {
		return err
	}
	if rules == nil {
		return nil
	}
	core, err := edge.New(g.Envoy, edge.Options{Count: o.Count, Settled: o.Settled, Deadline: cfg.Server.DecisionTimeout, Logger: o.Log, Prefix: "rls"})
	if err != nil {
		return err
	}
	g.RLS = &rls.State{Rules: rules, Limiter: g.Envoy, Store: o.Store, Pseudonymizer: g.Pseudonymizer, Core: core,
		MaxDescriptors: int(cfg.Envoy.MaxDescriptors), MaxEntries: int(cfg.Envoy.MaxEntries),
		ResponseMetadata: cfg.Envoy.ResponseMetadata}
	return nil
}

// failureModes are the failure modes of cfg's policies and rules', by
// ID: the config's failure_mode, and the rules files' rules'.
func failureModes(cfg *config.Config, rules *rules.Config) map[string]failure.Mode {
	modes := cfg.FailureModes()
	if rules != nil {
		for _, r := range rules.Rules() {
			if _, dup := modes[r.Policy.ID]; r.Decided() && !dup {
				modes[r.Policy.ID] = r.FailureMode
			}
		}
	}
	return modes
}

// PolicyIDs are the IDs of every policy cfg defines, the config's and
// then the rules files' (rules; nil without an envoy section): those
// decisions are counted under.
func PolicyIDs(cfg *config.Config, rules *rules.Config) []string {
	ids := make([]string, 0, len(cfg.Policies))
	for _, p := range cfg.Policies {
		ids = append(ids, p.ID)
	}
	if rules != nil {
		for _, p := range rules.Policies() {
			if !slices.Contains(ids, p.ID) {
				ids = append(ids, p.ID)
			}
		}
	}
	return ids
}

// EnvoyOverrides returns the config's overrides that name an Envoy
// subject (envoy: {domain, entries}) as the Envoy Limiter takes them:
// each matched to its rule in rs (the policy) and pseudonymized as
// the Envoy service does with pseud. The error names the override whose
// descriptor no rule the store decides matches, or whose numbers the
// rule's policy does not take.
func EnvoyOverrides(cfg *config.Config, rs *rules.Config, pseud *subject.Pseudonymizer) ([]sluice.Override, error) {
	var out []sluice.Override
	for i, o := range cfg.Overrides {
		if o.Envoy == nil {
			continue
		}
		path := fmt.Sprintf("overrides[%d].envoy", i)
		if rs == nil {
			return nil, fmt.Errorf("%s: there are no Envoy rules (envoy: configs) to match it to (line %d)", path, cfg.Line(path))
		}
		entries := make([]rules.Entry, len(o.Envoy.Entries))
		for j, kv := range o.Envoy.Entries {
			entries[j] = rules.Entry{Key: kv[0], Value: kv[1]}
		}
		st := &rls.State{Rules: rs, Pseudonymizer: pseud}
		policy, subj, _, err := st.OverrideSubject(o.Envoy.Domain, entries)
		if err != nil {
			return nil, fmt.Errorf("%s: %w (line %d)", path, err, cfg.Line(path))
		}
		if o.Policy != "" && o.Policy != policy {
			return nil, fmt.Errorf("overrides[%d].policy: %q: the descriptor's rule has policy %q; leave policy out or name that one (line %d)", i, o.Policy, policy, cfg.Line(path))
		}
		ov := sluice.Override{Policy: policy, Subject: subj, Limit: o.Limit, Burst: o.Burst, Window: o.Window, Note: o.Note}
		if err := checkOverride(rs, ov); err != nil {
			if pe, ok := errors.AsType[*policyerr.Error](err); ok {
				return nil, fmt.Errorf("overrides[%d].%s: %s: %s (line %d)", i, pe.Field, pe.Value, pe.Rule, cfg.Line(path))
			}
			return nil, fmt.Errorf("overrides[%d]: %w (line %d)", i, err, cfg.Line(path))
		}
		out = append(out, ov)
	}
	return out, nil
}

// checkOverride reports whether the numbers of o suit its policy in
// rules, by the policy's own rules (sluice.Policy.Validate).
func checkOverride(rules *rules.Config, o sluice.Override) error {
	for _, p := range rules.Policies() {
		if p.ID != o.Policy {
			continue
		}
		q := p
		q.Limit, q.Burst, q.MaxCost = o.Limit, o.Burst, 0
		q.LocalQuota = sluice.LocalQuota{} // the Limiter gives an override local quota's defaults for its own numbers, where they fit
		if o.Window != 0 {
			q.Window = o.Window
		}
		return q.Validate()
	}
	return nil
}

// envoyPolicies are the policies of the rules the store decides, as the
// Envoy Limiter takes them: with localQuota (envoy.local_quota), local
// quota on with its defaults for every rule that does not write its own
// (sluice_local_quota) and whose limit can take it.
func envoyPolicies(rs *rules.Config, localQuota bool) []sluice.Policy {
	var ps []sluice.Policy
	for _, r := range rs.Rules() {
		if !r.Decided() {
			continue
		}
		p := r.Policy
		if localQuota && !r.OwnLocalQuota {
			q := p
			q.LocalQuota.Enabled = true
			if q.Validate() == nil {
				p = q
			}
		}
		ps = append(ps, p)
	}
	return ps
}

// pseudonymizer builds the subject pseudonymizer from subjects.hmac_keys,
// warning when there is none.
func pseudonymizer(cfg *config.Config, getenv func(string) string, log *slog.Logger) (*subject.Pseudonymizer, error) {
	keys, err := cfg.HMACKeys(getenv)
	if err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		log.Warn("subjects.hmac_keys is not configured: subjects are digested with plain SHA-256, without a key, so anyone who can guess a subject can recompute its pseudonym; configure an HMAC key")
		return subject.Unkeyed(), nil
	}
	p, err := subject.New(keys)
	if err != nil {
		return nil, fmt.Errorf("subjects.hmac_keys: %w", err)
	}
	return p, nil
}
