package config

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/policyerr"
	"go.yaml.in/yaml/v3"
)

// Override is one entry of the overrides: section: the numbers of one
// subject of one of the config's policies. The subject is written raw;
// the server pseudonymizes it as POST /v1/check does before the Limiter
// sees it.
type Override struct {
	Policy  string // a policy's id; with Envoy, the rule's (may be left out)
	Subject string // the subject as a check names it, 1 to 200 bytes
	// Envoy, in place of Subject, names the subject as the Envoy
	// rate-limit service sees it: a descriptor of a domain, matched to
	// its rule (whose policy gets the numbers) once the rules files load.
	Envoy *EnvoyDescriptor
	// Proxy, in place of Subject, names a client of the reverse proxy as
	// one route sees it: its address or its subject header's value.
	Proxy *ProxyClient
	// RLQS, in place of Subject, names a bucket of Envoy's rate-limit
	// quota service: the first matcher of envoy.rlqs that matches it
	// gives the policy (Policy, when set, must be that one); its subject
	// is the pseudonym of the domain and the sorted bucket id, as the
	// service names it.
	RLQS   *RLQSBucketID
	Limit  int64         // the subject's limit, at least 1
	Burst  int64         // token_bucket and gcra only; 0: the limit
	Window time.Duration // not for concurrency; 0: the policy's
	Note   string        // what lists show in place of the subject, at most 200 bytes
}

// EnvoyDescriptor is a descriptor of Envoy's rate-limit service: its
// domain and entries, in order, as Envoy sends them.
type EnvoyDescriptor struct {
	Domain  string
	Entries [][2]string // key, value
}

// ProxyClient is a client of the reverse proxy on route Route (an index
// of proxy.routes): its address IP or the value Header of the route's
// subject header, one of them.
type ProxyClient struct {
	Route      int64
	IP, Header string
}

// validateOverrides checks each override on its own: a policy of the
// config, a subject, and numbers the policy's algorithm accepts by the
// rules of its own (sluice.Policy.Validate on the policy with the
// override's numbers); the same policy and subject at most once.
func (c *Config) validateOverrides() []*Error {
	var errs []*Error
	seen := map[[2]string]int{}
	buckets := map[string]int{}
	for i, o := range c.Overrides {
		path := fmt.Sprintf("overrides[%d]", i)
		if o.RLQS != nil {
			errs = append(errs, c.rlqsOverrideErrors(i, o, buckets)...)
			continue
		}
		if o.Envoy != nil || o.Proxy != nil {
			errs = append(errs, c.edgeOverrideErrors(path, o)...)
			continue
		}
		base := c.policy(o.Policy)
		switch {
		case base == nil:
			errs = append(errs, c.errorAt(path+".policy", strconv.Quote(o.Policy), "is not the id of any policy"))
			continue
		case o.Subject == "" || len(o.Subject) > 200:
			errs = append(errs, c.withoutValue(path+".subject", fmt.Sprintf("is %d bytes: must be 1 to 200", len(o.Subject))))
			continue
		case len(o.Note) > 200:
			errs = append(errs, c.errorAt(path+".note", strconv.Quote(o.Note), "must be at most 200 bytes"))
			continue
		case o.Limit < 1:
			errs = append(errs, c.errorAt(path+".limit", strconv.FormatInt(o.Limit, 10), "must be at least 1"))
			continue
		}
		if j, dup := seen[[2]string{o.Policy, o.Subject}]; dup {
			errs = append(errs, c.withoutValue(path+".subject", fmt.Sprintf("is already overridden for policy %s by overrides[%d]", o.Policy, j)))
			continue
		}
		seen[[2]string{o.Policy, o.Subject}] = i
		if err := c.overrideNumbers(path, base.Policy, o); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// overrideNumbers checks o's numbers on base, its policy, by the rules of
// base's algorithm: sluice.Policy.Validate on base with o's limit, burst
// and window; nil when they hold.
func (c *Config) overrideNumbers(path string, base sluice.Policy, o Override) *Error {
	q := base
	q.Limit, q.Burst, q.MaxCost = o.Limit, o.Burst, 0
	if base.Algorithm == sluice.Concurrency {
		if o.Burst != 0 {
			return c.errorAt(path+".burst", strconv.FormatInt(o.Burst, 10), "does not apply to concurrency: an override sets only its limit")
		}
		if o.Window != 0 {
			return c.errorAt(path+".window", o.Window.String(), "does not apply to concurrency, which has no window")
		}
	} else if o.Window != 0 {
		q.Window = o.Window
	}
	if err := q.Validate(); err != nil {
		if pe, ok := errors.AsType[*policyerr.Error](err); ok {
			return c.errorAt(path+"."+pe.Field, pe.Value, pe.Rule)
		}
		return c.errorAt(path, "", err.Error())
	}
	return nil
}

// edgeOverrideErrors checks what an override naming an Envoy subject or
// a proxy client can show on its own (the wiring matches it to its rule
// or route, and checks its policy and numbers, then): one way of naming
// the subject, a domain and 1 to 32 entries or a route and one of ip and
// header, a limit, a note of at most 200 bytes.
func (c *Config) edgeOverrideErrors(path string, o Override) []*Error {
	switch d := o.Envoy; {
	case o.Subject != "" || o.Envoy != nil && o.Proxy != nil:
		return []*Error{c.errorAt(path, "", "names its subject twice: set one of subject, envoy and proxy")}
	case o.Proxy != nil && (o.Proxy.Route < 0 || (o.Proxy.IP == "") == (o.Proxy.Header == "")):
		return []*Error{c.errorAt(path+".proxy", "", "needs route (0 or more, an index of proxy.routes) and one of ip and header")}
	case d != nil && d.Domain == "":
		return []*Error{c.errorAt(path+".envoy.domain", `""`, "is required: the domain of the Envoy descriptor")}
	case d != nil && (len(d.Entries) == 0 || len(d.Entries) > 32):
		return []*Error{c.errorAt(path+".envoy.entries", strconv.Itoa(len(d.Entries)), "must hold 1 to 32 entries {key, value}, as Envoy sends the descriptor")}
	case len(o.Note) > 200:
		return []*Error{c.errorAt(path+".note", strconv.Quote(o.Note), "must be at most 200 bytes")}
	case o.Limit < 1:
		return []*Error{c.errorAt(path+".limit", strconv.FormatInt(o.Limit, 10), "must be at least 1")}
	}
	return nil
}

// SluiceOverrides returns the overrides of check API subjects as
// sluice.Options.Overrides takes them, each subject passed through
// pseudonym first (those naming an Envoy subject, a proxy client or an
// RLQS bucket are left out: the wiring resolves them against the rules
// files, the proxy's routes and envoy.rlqs).
func (c *Config) SluiceOverrides(pseudonym func(string) string) []sluice.Override {
	out := make([]sluice.Override, 0, len(c.Overrides))
	for _, o := range c.Overrides {
		if o.Envoy == nil && o.Proxy == nil && o.RLQS == nil {
			out = append(out, sluice.Override{Policy: o.Policy, Subject: pseudonym(o.Subject), Limit: o.Limit, Burst: o.Burst, Window: o.Window, Note: o.Note})
		}
	}
	return out
}

// overrides decodes the overrides: section, a list of {policy, subject
// (or envoy, proxy or rlqs), limit, burst, window, note}.
func (d *decoder) overrides(n *yaml.Node) []Override {
	items, ok := d.sequence("overrides", n)
	if !ok {
		return nil
	}
	os := make([]Override, len(items))
	for i, item := range items {
		path := fmt.Sprintf("overrides[%d]", i)
		m, ok := d.mapping(path, item, "policy", "subject", "envoy", "proxy", "rlqs", "limit", "burst", "window", "note")
		if !ok {
			continue
		}
		if e, p, q := m["envoy"], m["proxy"], m["rlqs"]; e != nil || p != nil || q != nil {
			d.required(path, item, m, "limit")
			if e != nil {
				os[i].Envoy = d.envoyDescriptor(path+".envoy", e)
			}
			if p != nil {
				os[i].Proxy = d.proxyClient(path+".proxy", p)
			}
			if q != nil {
				os[i].RLQS = d.rlqsBucketID(path+".rlqs", q)
			}
		} else {
			d.required(path, item, m, "policy", "subject", "limit")
		}
		d.str(path+".policy", m["policy"], &os[i].Policy)
		d.str(path+".subject", m["subject"], &os[i].Subject)
		d.int(path+".limit", m["limit"], &os[i].Limit)
		d.int(path+".burst", m["burst"], &os[i].Burst)
		d.duration(path+".window", m["window"], &os[i].Window)
		d.str(path+".note", m["note"], &os[i].Note)
	}
	return os
}

// envoyDescriptor decodes an override's envoy: {domain, entries: [{key,
// value}, …]}; never nil, so a descriptor that did not decode still
// marks the override as naming an Envoy subject.
func (d *decoder) envoyDescriptor(path string, n *yaml.Node) *EnvoyDescriptor {
	e := &EnvoyDescriptor{}
	m, ok := d.mapping(path, n, "domain", "entries")
	if !ok {
		return e
	}
	d.required(path, n, m, "domain", "entries")
	d.str(path+".domain", m["domain"], &e.Domain)
	if m["entries"] == nil {
		return e
	}
	items, ok := d.sequence(path+".entries", m["entries"])
	if !ok {
		return e
	}
	for i, item := range items {
		ipath := fmt.Sprintf("%s.entries[%d]", path, i)
		em, ok := d.mapping(ipath, item, "key", "value")
		if !ok {
			continue
		}
		d.required(ipath, item, em, "key", "value")
		var kv [2]string
		d.str(ipath+".key", em["key"], &kv[0])
		d.str(ipath+".value", em["value"], &kv[1])
		e.Entries = append(e.Entries, kv)
	}
	return e
}

// proxyClient decodes an override's proxy: {route, ip | header}; never
// nil, so one that did not decode still marks the override as naming a
// proxy client.
func (d *decoder) proxyClient(path string, n *yaml.Node) *ProxyClient {
	p := &ProxyClient{Route: -1}
	m, ok := d.mapping(path, n, "route", "ip", "header")
	if !ok {
		return p
	}
	d.required(path, n, m, "route")
	d.int(path+".route", m["route"], &p.Route)
	d.str(path+".ip", m["ip"], &p.IP)
	d.str(path+".header", m["header"], &p.Header)
	return p
}
