package checkapi

// OverridesPath is the admin API of runtime overrides: PUT sets one
// (OverrideRequest), DELETE removes one (OverrideRequest with policy and
// subject only), GET lists them (OverrideList; ?policy= filters).
const OverridesPath = "/v1/overrides"

// OverrideRequest is the body of PUT and DELETE /v1/overrides. Subject is
// raw: the server pseudonymizes it as it does a check's. Window is a Go
// duration such as "1m"; "" keeps the policy's.
type OverrideRequest struct {
	Policy  string `json:"policy,omitempty"`
	Subject string `json:"subject,omitempty"`
	// Envoy, in place of Subject, names the subject as the Envoy
	// rate-limit service sees it: a descriptor of a domain. The server
	// matches it to its rule, whose policy Policy must be (or be left
	// empty), and pseudonymizes it as the service does.
	Envoy *EnvoyDescriptor `json:"envoy,omitempty"`
	// Proxy, in place of Subject, names a client of the reverse proxy as
	// one route of it sees it: its address or its header's value. The
	// server pseudonymizes it as that route does; Policy is one of the
	// route's (or left empty when it has one).
	Proxy *ProxyClient `json:"proxy,omitempty"`
	// RLQS, in place of Subject, names a bucket of Envoy's quota service:
	// its domain and bucket id. The first matcher of the domain that
	// takes the id gives the policy, which Policy must be (or be left
	// empty); the server names the bucket as the service does.
	RLQS   *RLQSBucket `json:"rlqs,omitempty"`
	Limit  int64       `json:"limit,omitempty"`
	Burst  int64       `json:"burst,omitempty"`
	Window string      `json:"window,omitempty"`
	Note   string      `json:"note,omitempty"`
}

// Forms returns how many of Subject, Envoy, Proxy and RLQS r sets: a
// write names its subject exactly one way.
func (r *OverrideRequest) Forms() int {
	n := 0
	for _, set := range []bool{r.Subject != "", r.Envoy != nil, r.Proxy != nil, r.RLQS != nil} {
		if set {
			n++
		}
	}
	return n
}

// RLQSBucket is a bucket of Envoy's quota service: a domain of
// envoy.rlqs and a bucket id, every value the bucket's own (never "*").
type RLQSBucket struct {
	Domain string            `json:"domain"`
	Bucket map[string]string `json:"bucket"`
}

// OverrideEntry is one override as lists show it: never its subject nor
// the subject's pseudonym. Source is "config" (the config file's
// overrides: section) or "api" (set at run time, kept by the store).
type OverrideEntry struct {
	Policy string `json:"policy"`
	Note   string `json:"note"`
	Limit  int64  `json:"limit"`
	Burst  int64  `json:"burst"`
	Window string `json:"window"`
	Source string `json:"source"`
}

// OverrideList is the answer of GET /v1/overrides, by policy then
// subject; and of PUT and DELETE, with the entry set or removed alone.
type OverrideList struct {
	Overrides []OverrideEntry `json:"overrides"`
	Error     string          `json:"error,omitempty"`
}

// EnvoyDescriptor is a descriptor of an Envoy rate-limit request: its
// domain and entries, in order, as Envoy sends them.
type EnvoyDescriptor struct {
	Domain  string       `json:"domain"`
	Entries []EnvoyEntry `json:"entries"`
}

// EnvoyEntry is one key and value of an EnvoyDescriptor.
type EnvoyEntry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// ProxyClient is a client of the reverse proxy on one route (its index
// in proxy.routes): IP, its address (masked as the route masks it), or
// Header, the value of the route's subject header; one of them.
type ProxyClient struct {
	Route  int    `json:"route"`
	IP     string `json:"ip,omitempty"`
	Header string `json:"header,omitempty"`
}
