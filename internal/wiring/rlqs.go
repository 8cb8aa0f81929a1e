package wiring

import (
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/envoy/rlqs"
	"github.com/sluicehq/sluice/subject"
)

// RLQS returns cfg's envoy.rlqs as Envoy's quota service takes it, each
// matcher's policy resolved among cfg's policies; nil without one. The
// config's validation has checked every name, so none is missing here.
func RLQS(cfg *config.Config) *rlqs.Config {
	if cfg.Envoy == nil || cfg.Envoy.RLQS == nil {
		return nil
	}
	rc := cfg.Envoy.RLQS
	policies := map[string]sluice.Policy{}
	for _, p := range cfg.SluicePolicies() {
		policies[p.ID] = p
	}
	out := &rlqs.Config{Round: rc.Round, MaxBucketsPerDomain: int(rc.MaxBucketsPerDomain), MaxBucketsPerStream: int(rc.MaxBucketsPerStream)}
	for _, d := range rc.Domains {
		ms := make([]rlqs.Matcher, len(d.Buckets))
		for i, b := range d.Buckets {
			ms[i] = rlqs.Matcher{Match: b.Match, Policy: policies[b.Policy]}
		}
		out.Domains = append(out.Domains, rlqs.Domain{Name: d.Domain, Matchers: ms})
	}
	return out
}

// rlqsOverrides returns cfg's overrides that name an RLQS bucket as the
// config's Limiter takes them: the policy of the bucket's matcher, the
// subject the quota service names the bucket with (pseud).
func rlqsOverrides(cfg *config.Config, pseud *subject.Pseudonymizer) []sluice.Override {
	var out []sluice.Override
	for _, o := range cfg.Overrides {
		if o.RLQS == nil {
			continue
		}
		m, ok := cfg.Envoy.RLQS.Match(o.RLQS.Domain, o.RLQS.Bucket)
		if !ok { // validation refuses it: never here
			continue
		}
		out = append(out, sluice.Override{Policy: m.Policy, Subject: rlqs.Subject(pseud, o.RLQS.Domain, o.RLQS.Bucket),
			Limit: o.Limit, Burst: o.Burst, Window: o.Window, Note: o.Note})
	}
	return out
}
