package config

import (
	"fmt"
	"path/filepath"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// Envoy configures the Envoy rate-limit (RLS v3) gRPC service.
type Envoy struct {
	Listen  string   // host:port
	Configs []string // glob patterns of files in envoyproxy/ratelimit's format
	// LocalQuota turns local quota (sluice.Policy.LocalQuota, with its
	// defaults) on for every rule whose limit can take it (a max_cost of
	// at least 8: 8 per unit); smaller limits stay decided by the store,
	// one request at a time. A rule that writes sluice_local_quota keeps
	// its own, either way.
	LocalQuota bool
	// MaxDescriptors bounds the descriptors of one request, 1 to 10000,
	// and MaxEntries the entries of one descriptor, 1 to 10000; a request
	// over either is refused InvalidArgument. 0: the defaults, 64 and 32.
	MaxDescriptors, MaxEntries int64
	// ResponseMetadata sends dynamic metadata with every answer (the
	// domain, the descriptors, the metadata of the rules that passed), as
	// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA does.
	ResponseMetadata bool
	// RLQS configures Envoy's rate-limit quota service on the same
	// listener; nil when absent. Configs, RLQS or both must be set.
	RLQS *RLQS
}

func (c *Config) validateEnvoy() []*Error {
	e := c.Envoy
	if e == nil {
		return nil
	}
	var errs []*Error
	if rule := checkHostPort(e.Listen, true); rule != "" {
		errs = append(errs, c.errorAt("envoy.listen", strconv.Quote(e.Listen), rule))
	} else if sameAddr(e.Listen, c.Server.Listen) || c.Proxy != nil && sameAddr(e.Listen, c.Proxy.Listen) {
		errs = append(errs, c.errorAt("envoy.listen", strconv.Quote(e.Listen), "must differ from server.listen and proxy.listen"))
	}
	if len(e.Configs) == 0 && e.RLQS == nil {
		errs = append(errs, c.errorAt("envoy.configs", "", "is required unless envoy.rlqs is set: at least one rules file pattern for the rate-limit service, or an rlqs: section for the quota service"))
	}
	for i, pat := range e.Configs {
		if _, err := filepath.Match(pat, ""); pat == "" || err != nil {
			errs = append(errs, c.errorAt(fmt.Sprintf("envoy.configs[%d]", i), strconv.Quote(pat), "must be a file path or glob pattern such as ratelimit/*.yaml"))
		}
	}
	for _, b := range []struct {
		field string
		v     int64
	}{{"max_descriptors", e.MaxDescriptors}, {"max_entries", e.MaxEntries}} {
		if b.v < 0 || b.v > 10000 {
			errs = append(errs, c.errorAt("envoy."+b.field, strconv.FormatInt(b.v, 10), "must be between 1 and 10000"))
		}
	}
	if e.RLQS != nil {
		errs = append(errs, c.validateRLQS(e.RLQS)...)
	}
	return errs
}

func (d *decoder) envoy(n *yaml.Node) *Envoy {
	m, ok := d.mapping("envoy", n, "listen", "configs", "local_quota", "max_descriptors", "max_entries", "response_metadata", "rlqs")
	if !ok {
		return nil
	}
	e := &Envoy{}
	d.str("envoy.listen", m["listen"], &e.Listen)
	d.strs("envoy.configs", m["configs"], &e.Configs)
	d.bool("envoy.local_quota", m["local_quota"], &e.LocalQuota)
	d.int("envoy.max_descriptors", m["max_descriptors"], &e.MaxDescriptors)
	d.int("envoy.max_entries", m["max_entries"], &e.MaxEntries)
	d.bool("envoy.response_metadata", m["response_metadata"], &e.ResponseMetadata)
	if m["rlqs"] != nil {
		e.RLQS = d.rlqs("envoy.rlqs", m["rlqs"])
	}
	return e
}
