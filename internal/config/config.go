// Package config reads the YAML configuration of sluice serve.
//
// Parse decodes strictly: an unknown key, a wrong type or a value that
// breaks a rule is an *Error naming the field path, the value as written,
// the rule and the line, e.g.
//
//	policies[1].window: "90h": must be between 1ms and 24h (line 14)
//
// Parse reports every such error it finds, as Errors when there are
// several.
//
// Policy numbers are checked by sluice.Policy.Validate, so the library and
// the config never disagree about what a valid policy is.
package config

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	pathpkg "path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/policyerr"

	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/yamlnode"
	"github.com/sluicehq/sluice/subject"
)

// Store types.
const (
	StoreMemory = "memory" // the embedded store (memstore)
	StoreRedis  = "redis"  // Redis, standalone, Sentinel or Cluster (redisstore)
)

// Redis modes used with Redis.Addrs.
const (
	ModeCluster  = "cluster"
	ModeSentinel = "sentinel"
)

// DefaultListen is the address sluice serve listens on when the config
// names none.
const DefaultListen = "127.0.0.1:8080"

// DefaultProxyListen is the address the reverse proxy listens on when
// proxy.listen is absent. The proxy has an address of its own so that
// every path reaches the upstream (none is shadowed by /v1/check,
// /metrics or the health checks) and the check API and metrics can stay
// on a private interface while the proxy faces clients.
const DefaultProxyListen = "127.0.0.1:8090"

// DefaultLocalShare is the share of each failure_mode: local policy the
// proxy's local fallback holds when proxy.local_share is absent.
const DefaultLocalShare = 0.1

// Config is the whole configuration of sluice serve. Parse fills in the
// defaults of absent keys (server.listen, store.type); a Config built in
// Go must set them itself (see Default). Validate checks it.
type Config struct {
	Server   Server
	Store    Store
	Policies []Policy
	Subjects Subjects
	// Proxy configures the rate-limiting reverse proxy; nil when absent.
	Proxy *Proxy
	// Envoy configures the Envoy rate-limit gRPC service; nil when absent.
	Envoy *Envoy
	// Telemetry configures the export of traces; nil when absent (none).
	Telemetry *Telemetry
	// Overrides give one subject of one policy other numbers (a tenant's
	// plan), applied by this process from the config; none when absent.
	Overrides []Override

	// pos maps field paths ("policies[1].window") to where Parse read
	// them; nil for a Config built in Go.
	pos map[string]position
}

// position is where a value was written and how, for error messages.
type position struct {
	line  int
	value string // as written: strings quoted, numbers bare; "" for collections
}

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
	Proxy  *ProxyClient
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

// Server configures the HTTP check API.
type Server struct {
	// Listen is the host:port to listen on; port 0 picks a free port.
	// Default: DefaultListen.
	Listen string
	// TLS, when set, serves the check API over HTTPS. Default: nil, HTTP.
	TLS *TLS
	// Auth, when set, makes POST /v1/check require a bearer token.
	// Default: nil, anyone who can reach Listen may check and refund.
	Auth *Auth
	// DecisionTimeout is how long POST /v1/check waits for the store's
	// decision before it answers 503 (unavailable, nothing spent, or
	// indeterminate), 1ms to 10s. Parse defaults it to
	// DefaultDecisionTimeout.
	DecisionTimeout time.Duration
}

// TLS names the certificate and key files of an HTTPS listener.
type TLS struct {
	CertFile string // PEM certificate chain, leaf first
	KeyFile  string // PEM private key of the leaf
}

// Auth lists the bearer tokens the check API accepts.
type Auth struct {
	Tokens []Token
}

// Token is one bearer token of the check API. Its secret lives in an
// environment variable, never in the file.
type Token struct {
	ID        string   // names the token in logs: 1 to 32 of a-z 0-9 _ -
	SecretEnv string   // name of the environment variable holding the token
	Scopes    []string // what the token may do: ScopeCheck, ScopeRefund, ScopeReset, ScopeAdmin
}

// Scopes of a Token.
const (
	// ScopeCheck allows spending and peeking: POST /v1/check; and giving
	// back or renewing a lease that check acquired: POST /v1/release,
	// POST /v1/renew (the lease id entitles its holder).
	ScopeCheck = "check"
	// ScopeRefund allows giving units back: POST /v1/check with
	// "refund": true.
	ScopeRefund = "refund"
	// ScopeReset allows clearing a subject's state: POST /v1/check with
	// "reset": true.
	ScopeReset = "reset"
	// ScopeAdmin allows the operator's views: the dashboard at GET /ui
	// and its playground.
	ScopeAdmin = "admin"
)

// Scopes lists every scope a Token may hold, for messages.
const Scopes = ScopeCheck + ", " + ScopeRefund + ", " + ScopeReset + ", " + ScopeAdmin

// ValidScope reports whether s is a scope a Token may hold.
func ValidScope(s string) bool {
	return s == ScopeCheck || s == ScopeRefund || s == ScopeReset || s == ScopeAdmin
}

// MinTokenLen is the shortest bearer token secret, in bytes.
const MinTokenLen = 16

// ResolvedToken is a Token with its secret read from the environment.
type ResolvedToken struct {
	ID     string
	Secret []byte
	Scopes []string
}

// Store selects and configures the store.
type Store struct {
	// Type is StoreMemory or StoreRedis. Default: StoreMemory.
	Type string
	// Redis configures the Redis connection; required for StoreRedis and
	// nil otherwise.
	Redis *Redis
}

// Redis says how to reach Redis: either URL (one server) or Addrs with a
// Mode.
type Redis struct {
	// URL is a redis:// or rediss:// URL, e.g. "redis://127.0.0.1:6379/0".
	URL string
	// Addrs are host:port seeds of a cluster or the sentinels.
	Addrs []string
	// Mode is ModeCluster or ModeSentinel; required with Addrs.
	Mode string
	// MasterName is the Sentinel master; required with ModeSentinel.
	MasterName string
	// Username is the ACL user, if any.
	Username string
	// PasswordEnv names the environment variable holding the password.
	PasswordEnv string
	// Timeout bounds each round trip of decisions to Redis, 1ms to 1m;
	// past it they are undecidable and the failure mode answers. 0: the
	// store's default (1s).
	Timeout time.Duration
	// DialTimeout bounds opening a connection, 1ms to 1m. 0: go-redis's
	// default (5s).
	DialTimeout time.Duration
	// PoolSize is the most connections to each Redis node, 1 to 10000.
	// Decisions that meet share pipelines, so few are needed. 0:
	// go-redis's default (10 per CPU).
	PoolSize int64
	// WaitReplicas, 0 to 16, has every decision acknowledged by that many
	// replicas before it is answered (redisstore.Options.WaitReplicas):
	// for limits where an over-admission after a failover matters, at
	// about twice the latency; a decision fewer replicas acknowledged is
	// indeterminate. Not with a Ring. 0: no wait.
	WaitReplicas int64
}

// Password returns the password from the environment variable named by
// PasswordEnv, via getenv; "" when PasswordEnv is unset.
func (r *Redis) Password(getenv func(string) string) (string, error) {
	if r == nil || r.PasswordEnv == "" {
		return "", nil
	}
	pw := getenv(r.PasswordEnv)
	if pw == "" {
		return "", &Error{Path: "store.redis.password_env", Value: strconv.Quote(r.PasswordEnv), Rule: "environment variable " + r.PasswordEnv + " is not set or empty"}
	}
	return pw, nil
}

// Policy is one policy of the config (near_cache is sluice.Policy's
// NearCache; align: clock is its ClockAligned, align: first_request, the
// default, leaves it false; local_quota: true, or a mapping of
// block_time and max_block, is its LocalQuota).
type Policy struct {
	sluice.Policy
	// FailureMode is failure_mode: what the edges spending the policy
	// (the proxy's routes) answer when the store cannot decide; a rule's
	// property, kept beside the policy in the file's spelling. Default:
	// failure.Closed.
	FailureMode failure.Mode
}

// Subjects configures how subjects are pseudonymized.
type Subjects struct {
	// HMACKeys are the pseudonymization keys, newest first; the first one
	// keys new decisions. Empty: subjects are digested without a key.
	HMACKeys []HMACKey
}

// HMACKey names one HMAC key; its secret lives in an environment variable,
// never in the file.
type HMACKey struct {
	ID        string // 1 to 16 of a-z 0-9, part of every pseudonym
	SecretEnv string // name of the environment variable holding the secret
}

// Proxy configures the rate-limiting reverse proxy.
type Proxy struct {
	// Listen is the host:port the proxy listens on, distinct from
	// server.listen. Parse defaults it to DefaultProxyListen.
	Listen         string
	Upstream       string   // http:// or https:// URL
	TrustedProxies []string // CIDRs whose X-Forwarded-For is believed
	Routes         []Route
	// LocalShare is the share (0, 1] of a failure_mode: local policy's
	// limit that this instance enforces on its own while the store cannot
	// decide: 1/N for N proxy instances. Parse defaults it to
	// DefaultLocalShare.
	LocalShare float64
	// DecisionTimeout is how long the proxy waits for the store's
	// decision before the route's failure mode answers, 1ms to 10s.
	// Parse defaults it to DefaultDecisionTimeout.
	DecisionTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included, 1s to
	// 1h, so a client that sends its body slowly cannot hold connections
	// forever. Parse defaults it to DefaultProxyReadTimeout.
	ReadTimeout time.Duration
}

// DefaultProxyReadTimeout is proxy.read_timeout when it is absent.
const DefaultProxyReadTimeout = time.Minute

// DefaultDecisionTimeout is server.decision_timeout and
// proxy.decision_timeout when they are absent: 500ms, long enough that a
// burst of 500 concurrent requests on a busy two-core machine with a
// healthy local Redis gets no 503 (100ms gave about half of them one),
// short enough that a failing store is answered by the failure mode well
// within a second. It equals httplimit.DefaultDeadline, the middleware's
// own default (a test of internal/server holds them equal); the config
// names its own so that it imports no edge package.
const DefaultDecisionTimeout = 500 * time.Millisecond

// Route applies policies to matching proxied requests.
type Route struct {
	Match    Match
	Policies []string // policy IDs, checked together
	Subject  string   // "ip", "ip+user_agent" or "header:<Name>". Default: "ip"
	Shadow   bool     // evaluate and report, never block
	// SettleHeader, when set, is the upstream response header (or
	// trailer) reporting what a request really cost, e.g. X-Tokens-Used:
	// the route spends Estimate units up front (sluice.Estimate) and
	// settles them with that value (a header's as it arrives, a
	// trailer's once the body is done).
	SettleHeader string
	// Estimate is what a request of a route with SettleHeader spends up
	// front, at most each policy's max_cost. Default: 1.
	Estimate int64
	// Operation names the route's budgets inside every subject: routes
	// naming the same operation share them (a sheddable route and a
	// critical one on one budget). Default: the match, e.g. "POST /api".
	Operation string
	// Priority is the priority class the route's requests are decided as
	// (sluice.Request.Priority), one a policy of the route declares.
	// Default: "", the class "default".
	Priority string
	// PriorityHeader, when set, is a request header naming the request's
	// class, believed only from a peer in proxy.trusted_proxies (the
	// gateway in front) and only when a policy of the route declares it;
	// otherwise Priority applies.
	PriorityHeader string
	// MaxDelay, when set, holds a request that would be denied for up to
	// this long for the slot it books (httplimit.Route.MaxDelay): one
	// gcra or token_bucket policy. Default: 0, refused at once.
	MaxDelay time.Duration
	// QueueLimit is the most requests the route holds at once. Default:
	// 1000.
	QueueLimit int64
}

// The kinds of subject a proxy route limits by (Route.SubjectKind).
const (
	// SubjectIP is "ip": the client address behind the trusted proxies.
	SubjectIP = "ip"
	// SubjectIPUserAgent is "ip+user_agent": the client address with a
	// digest of the User-Agent; the address alone without one.
	SubjectIPUserAgent = "ip+user_agent"
	// SubjectHeader is "header:<Name>": the value of request header Name;
	// the client address without it.
	SubjectHeader = "header"
)

// SubjectKind returns the kind of r.Subject, SubjectIP, SubjectIPUserAgent
// or SubjectHeader, and for SubjectHeader the header's name, e.g.
// "X-Api-Key" for "header:X-Api-Key". It returns "" for a subject
// Validate refuses.
func (r Route) SubjectKind() (kind, header string) {
	switch name, isHeader := strings.CutPrefix(r.Subject, SubjectHeader+":"); {
	case r.Subject == SubjectIP, r.Subject == SubjectIPUserAgent:
		return r.Subject, ""
	case isHeader && httpguts.ValidHeaderFieldName(name):
		return SubjectHeader, name
	}
	return "", ""
}

// Match selects requests for a Route.
type Match struct {
	PathPrefix string   // must start with "/"
	Methods    []string // empty: every method
}

// Envoy configures the Envoy rate-limit (RLS v3) gRPC service.
type Envoy struct {
	Listen  string   // host:port
	Configs []string // glob patterns of files in envoyproxy/ratelimit's format
	// LocalQuota turns local quota (sluice.Policy.LocalQuota, with its
	// defaults) on for every rule whose limit can take it (a max_cost of
	// at least 8: 8 per unit); smaller limits stay decided by the store,
	// one request at a time.
	LocalQuota bool
	// MaxDescriptors bounds the descriptors of one request, 1 to 10000,
	// and MaxEntries the entries of one descriptor, 1 to 10000; a request
	// over either is refused InvalidArgument. 0: the defaults, 64 and 32.
	MaxDescriptors, MaxEntries int64
	// ResponseMetadata sends dynamic metadata with every answer (the
	// domain, the descriptors, the metadata of the rules that passed), as
	// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA does.
	ResponseMetadata bool
}

// Errors is every rule a config breaks, in the order of the file. Parse
// returns it when it finds more than one; errors.As finds each *Error.
type Errors []*Error

// Error lists the errors, one per line.
func (es Errors) Error() string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// Unwrap returns the errors for errors.Is and errors.As.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// joinErrors returns nil for no errors, the *Error itself for one, and
// Errors sorted by line for several.
func joinErrors(es []*Error) error {
	switch len(es) {
	case 0:
		return nil
	case 1:
		return es[0]
	}
	slices.SortStableFunc(es, func(a, b *Error) int { return cmp.Compare(a.Line, b.Line) })
	return Errors(es)
}

// Error is a config value that breaks a rule. Its message reads
// "path: value: rule (line N)", leaving out what is unknown.
type Error = yamlnode.Error

// Default returns the built-in example config that sluice serve uses
// without --config: the embedded store on 127.0.0.1:8080 and three
// policies, "demo" (fixed_window, 3 per 10s), "login" (sliding_log, 5 per
// minute) and "api" (gcra, 100 per second, burst 20).
func Default() *Config {
	return &Config{
		Server: Server{Listen: DefaultListen, DecisionTimeout: DefaultDecisionTimeout},
		Store:  Store{Type: StoreMemory},
		Policies: []Policy{
			{Policy: sluice.Policy{ID: "demo", Algorithm: sluice.FixedWindow, Limit: 3, Window: 10 * time.Second}},
			{Policy: sluice.Policy{ID: "login", Algorithm: sluice.SlidingLog, Limit: 5, Window: time.Minute}},
			{Policy: sluice.Policy{ID: "api", Algorithm: sluice.GCRA, Limit: 100, Window: time.Second, Burst: 20}},
		},
	}
}

// Load reads and parses the file at path. Its errors start with path. As
// with Parse, a config that decodes but breaks rules comes back with the
// error.
func Load(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	c, err := Parse(f)
	if err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// FailureModes returns each policy's failure_mode, by ID.
func (c *Config) FailureModes() map[string]failure.Mode {
	modes := make(map[string]failure.Mode, len(c.Policies))
	for _, p := range c.Policies {
		modes[p.ID] = p.FailureMode
	}
	return modes
}

// SluicePolicies returns the policies as sluice.New takes them.
func (c *Config) SluicePolicies() []sluice.Policy {
	ps := make([]sluice.Policy, len(c.Policies))
	for i, p := range c.Policies {
		ps[i] = p.Policy
	}
	return ps
}

// HMACKeys resolves the secrets of Subjects.HMACKeys through getenv
// (os.Getenv in production). A missing or too short secret is an *Error
// naming the environment variable.
func (c *Config) HMACKeys(getenv func(string) string) ([]subject.Key, error) {
	keys := make([]subject.Key, 0, len(c.Subjects.HMACKeys))
	for i, k := range c.Subjects.HMACKeys {
		path := fmt.Sprintf("subjects.hmac_keys[%d].secret_env", i)
		secret := getenv(k.SecretEnv)
		switch {
		case secret == "":
			return nil, c.errorAt(path, strconv.Quote(k.SecretEnv), "environment variable "+k.SecretEnv+" is not set or empty")
		case len(secret) < minSecretLen:
			return nil, c.errorAt(path, strconv.Quote(k.SecretEnv), fmt.Sprintf("environment variable %s holds %d bytes: an HMAC secret must be at least %d (32 random bytes recommended)", k.SecretEnv, len(secret), minSecretLen))
		}
		keys = append(keys, subject.Key{ID: k.ID, Secret: []byte(secret)})
	}
	return keys, nil
}

// Tokens resolves the secrets of Server.Auth.Tokens through getenv
// (os.Getenv in production). A missing or too short secret is an *Error
// naming the environment variable; every such token is reported.
func (c *Config) Tokens(getenv func(string) string) ([]ResolvedToken, error) {
	if c.Server.Auth == nil {
		return nil, nil
	}
	var (
		out  []ResolvedToken
		errs []*Error
	)
	for i, t := range c.Server.Auth.Tokens {
		path := fmt.Sprintf("server.auth.tokens[%d].secret_env", i)
		secret := getenv(t.SecretEnv)
		switch {
		case secret == "":
			errs = append(errs, c.errorAt(path, strconv.Quote(t.SecretEnv), "environment variable "+t.SecretEnv+" is not set or empty"))
		case len(secret) < MinTokenLen:
			errs = append(errs, c.errorAt(path, strconv.Quote(t.SecretEnv), fmt.Sprintf("environment variable %s holds %d bytes: a token must be at least %d (32 random bytes recommended)", t.SecretEnv, len(secret), MinTokenLen)))
		}
		out = append(out, ResolvedToken{ID: t.ID, Secret: []byte(secret), Scopes: slices.Clone(t.Scopes)})
	}
	if err := joinErrors(errs); err != nil {
		return nil, err
	}
	return out, nil
}

// Line returns the line Parse read path from, e.g. "proxy"; 0 when
// unknown.
func (c *Config) Line(path string) int { return c.pos[path].line }

// Validate reports every value that breaks a rule: one *Error, or Errors
// sorted by line when there are several. Sections, list entries and the
// fields of a policy or route are checked independently; where one rule
// depends on another (a store's mode on its addrs, a token's scopes on
// its id) the first broken one is reported.
func (c *Config) Validate() error {
	var errs []*Error
	add := func(err *Error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, c.validateServer()...)
	add(c.validateStore())
	errs = append(errs, c.validatePolicies()...)
	errs = append(errs, c.validateSubjects()...)
	errs = append(errs, c.validateProxy()...)
	add(c.validateEnvoy())
	errs = append(errs, c.validateTelemetry()...)
	errs = append(errs, c.validateOverrides()...)
	return joinErrors(errs)
}

// validateOverrides checks each override on its own: a policy of the
// config, a subject, and numbers the policy's algorithm accepts by the
// rules of its own (sluice.Policy.Validate on the policy with the
// override's numbers); the same policy and subject at most once.
func (c *Config) validateOverrides() []*Error {
	var errs []*Error
	seen := map[[2]string]int{}
	for i, o := range c.Overrides {
		path := fmt.Sprintf("overrides[%d]", i)
		if o.Envoy != nil || o.Proxy != nil {
			errs = append(errs, c.edgeOverrideErrors(path, o)...)
			continue
		}
		var base *sluice.Policy
		for j := range c.Policies {
			if c.Policies[j].ID == o.Policy {
				base = &c.Policies[j].Policy
			}
		}
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
		q := *base
		q.Limit, q.Burst, q.MaxCost = o.Limit, o.Burst, 0
		if base.Algorithm == sluice.Concurrency {
			if o.Burst != 0 {
				errs = append(errs, c.errorAt(path+".burst", strconv.FormatInt(o.Burst, 10), "does not apply to concurrency: an override sets only its limit"))
				continue
			}
			if o.Window != 0 {
				errs = append(errs, c.errorAt(path+".window", o.Window.String(), "does not apply to concurrency, which has no window"))
				continue
			}
		} else if o.Window != 0 {
			q.Window = o.Window
		}
		if err := q.Validate(); err != nil {
			if pe, ok := errors.AsType[*policyerr.Error](err); ok {
				errs = append(errs, c.errorAt(path+"."+pe.Field, pe.Value, pe.Rule))
			} else {
				errs = append(errs, c.errorAt(path, "", err.Error()))
			}
		}
	}
	return errs
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
// pseudonym first (those naming an Envoy subject or a proxy client are
// left out: the wiring resolves them against the rules files and the
// proxy's routes).
func (c *Config) SluiceOverrides(pseudonym func(string) string) []sluice.Override {
	out := make([]sluice.Override, 0, len(c.Overrides))
	for _, o := range c.Overrides {
		if o.Envoy == nil && o.Proxy == nil {
			out = append(out, sluice.Override{Policy: o.Policy, Subject: pseudonym(o.Subject), Limit: o.Limit, Burst: o.Burst, Window: o.Window, Note: o.Note})
		}
	}
	return out
}

// errorAt builds an *Error for path. When Parse read path, the value as
// written and its line win over value; otherwise the line is that of the
// nearest enclosing value Parse read.
func (c *Config) errorAt(path, value, rule string) *Error {
	e := &Error{Path: path, Value: value, Rule: rule}
	if p, ok := c.pos[path]; ok {
		e.Line = p.line
		if p.value != "" {
			e.Value = p.value
		}
		return e
	}
	for q := parent(path); q != ""; q = parent(q) {
		if p, ok := c.pos[q]; ok {
			e.Line = p.line
			break
		}
	}
	return e
}

// withoutValue is errorAt for a path whose value names a subject (an
// override's): the error names the field and its line, never the value,
// which would reach a log line.
func (c *Config) withoutValue(path, rule string) *Error {
	e := c.errorAt(path, "", rule)
	e.Value = ""
	return e
}

// parent strips the last ".key" or "[i]" from path.
func parent(path string) string {
	i := strings.LastIndexAny(path, ".[")
	if i < 0 {
		return ""
	}
	return path[:i]
}

func (c *Config) validateServer() []*Error {
	var errs []*Error
	if c.Server.Listen == "" {
		errs = append(errs, c.errorAt("server.listen", "", "is required: host:port, such as "+DefaultListen))
	} else if rule := checkHostPort(c.Server.Listen, true); rule != "" {
		errs = append(errs, c.errorAt("server.listen", strconv.Quote(c.Server.Listen), rule))
	}
	if t := c.Server.DecisionTimeout; t < time.Millisecond || t > 10*time.Second {
		errs = append(errs, c.errorAt("server.decision_timeout", t.String(), "must be between 1ms and 10s"))
	}
	if t := c.Server.TLS; t != nil {
		if t.CertFile == "" {
			errs = append(errs, c.errorAt("server.tls.cert_file", "", "is required with server.tls: the PEM certificate file"))
		}
		if t.KeyFile == "" {
			errs = append(errs, c.errorAt("server.tls.key_file", "", "is required with server.tls: the PEM private key file"))
		}
	}
	if a := c.Server.Auth; a != nil {
		if len(a.Tokens) == 0 {
			return append(errs, c.errorAt("server.auth.tokens", "", "at least one token is required; leave out server.auth for an open check API"))
		}
		seen := map[string]int{}
		for i, t := range a.Tokens {
			if err := c.validateToken(i, t, seen); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errs
}

// validateToken reports the first rule server.auth.tokens[i] breaks;
// seen maps the ids before it to their index.
func (c *Config) validateToken(i int, t Token, seen map[string]int) *Error {
	path := fmt.Sprintf("server.auth.tokens[%d]", i)
	if !validTokenID(t.ID) {
		return c.errorAt(path+".id", strconv.Quote(t.ID), "must be 1 to 32 of a-z 0-9 _ -")
	}
	if j, dup := seen[t.ID]; dup {
		return c.errorAt(path+".id", strconv.Quote(t.ID), fmt.Sprintf("is already the id of server.auth.tokens[%d]", j))
	}
	seen[t.ID] = i
	if !validEnvName(t.SecretEnv) {
		return c.errorAt(path+".secret_env", strconv.Quote(t.SecretEnv), envNameRule)
	}
	if len(t.Scopes) == 0 {
		return c.errorAt(path+".scopes", "", "at least one scope is required: "+Scopes)
	}
	for j, sc := range t.Scopes {
		if !ValidScope(sc) {
			return c.errorAt(fmt.Sprintf("%s.scopes[%d]", path, j), strconv.Quote(sc), "must be one of "+Scopes)
		}
	}
	return nil
}

func validTokenID(id string) bool {
	if len(id) < 1 || len(id) > 32 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// checkRedisURL returns the rule a redis:// URL breaks, or "": the
// scheme, the host and port, and the database number, each named.
func checkRedisURL(raw string) string {
	const example = "such as redis://127.0.0.1:6379/0"
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) && strings.Contains(ue.Err.Error(), "invalid port") {
			return "the port must be a number between 1 and 65535, " + example
		}
		return "must be a redis:// or rediss:// URL, " + example + ": " + strings.TrimPrefix(err.Error(), "parse "+strconv.Quote(raw)+": ")
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return "must be a redis:// or rediss:// URL, " + example
	}
	if u.Hostname() == "" {
		return "must name a host, " + example
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return "the port must be a number between 1 and 65535, " + example
		}
	}
	if db := strings.TrimPrefix(u.Path, "/"); db != "" {
		if n, err := strconv.ParseUint(db, 10, 31); err != nil {
			return fmt.Sprintf("the database number %q must be a whole number such as 0, %s", db, example)
		} else if n > 1<<20 {
			return fmt.Sprintf("the database number %d is out of range, %s", n, example)
		}
	}
	return ""
}

func (c *Config) validateStore() *Error {
	s := c.Store
	switch s.Type {
	case StoreMemory:
		if s.Redis != nil {
			return c.errorAt("store.redis", "", "applies only to store.type redis")
		}
		return nil
	case StoreRedis:
	default:
		return c.errorAt("store.type", strconv.Quote(s.Type), "must be one of memory, redis")
	}
	r := s.Redis
	if r == nil {
		return c.errorAt("store.redis", "", "is required when store.type is redis")
	}
	switch {
	case r.URL != "" && len(r.Addrs) > 0:
		return c.errorAt("store.redis.addrs", "", "set url or addrs, not both")
	case r.URL == "" && len(r.Addrs) == 0:
		return c.errorAt("store.redis", "", "needs url (one server) or addrs with mode cluster or sentinel")
	case r.URL != "":
		if rule := checkRedisURL(r.URL); rule != "" {
			return c.errorAt("store.redis.url", strconv.Quote(r.URL), rule)
		}
		if r.Mode != "" {
			return c.errorAt("store.redis.mode", strconv.Quote(r.Mode), "applies only with addrs; a url names one server")
		}
	default:
		for i, a := range r.Addrs {
			if rule := checkHostPort(a, false); rule != "" {
				return c.errorAt(fmt.Sprintf("store.redis.addrs[%d]", i), strconv.Quote(a), rule)
			}
		}
		if r.Mode == "" {
			return c.errorAt("store.redis.mode", "", "is required with addrs: cluster or sentinel")
		}
		if r.Mode != ModeCluster && r.Mode != ModeSentinel {
			return c.errorAt("store.redis.mode", strconv.Quote(r.Mode), "must be one of cluster, sentinel")
		}
	}
	if r.Mode == ModeSentinel && r.MasterName == "" {
		return c.errorAt("store.redis.master_name", "", "is required with mode sentinel")
	}
	if r.Mode != ModeSentinel && r.MasterName != "" {
		return c.errorAt("store.redis.master_name", strconv.Quote(r.MasterName), "applies only to mode sentinel")
	}
	if r.PasswordEnv != "" && !validEnvName(r.PasswordEnv) {
		return c.errorAt("store.redis.password_env", strconv.Quote(r.PasswordEnv), envNameRule)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"timeout", r.Timeout}, {"dial_timeout", r.DialTimeout}} {
		if d.v != 0 && (d.v < time.Millisecond || d.v > time.Minute) {
			return c.errorAt("store.redis."+d.field, d.v.String(), "must be between 1ms and 1m")
		}
	}
	if r.PoolSize < 0 || r.PoolSize > 10000 {
		return c.errorAt("store.redis.pool_size", strconv.FormatInt(r.PoolSize, 10), "must be between 1 and 10000")
	}
	if r.WaitReplicas < 0 || r.WaitReplicas > 16 {
		return c.errorAt("store.redis.wait_replicas", strconv.FormatInt(r.WaitReplicas, 10), "must be between 0 and 16")
	}
	return nil
}

func (c *Config) validatePolicies() []*Error {
	if len(c.Policies) == 0 && c.Proxy == nil && c.Envoy == nil {
		if _, written := c.pos["policies"]; written {
			return []*Error{c.errorAt("policies", "", "is empty, and the config "+needsSomething)}
		}
		return []*Error{{Rule: "the config " + needsSomething, Line: c.pos[""].line}}
	}
	var errs []*Error
	seen := make(map[string]int, len(c.Policies))
	for i, p := range c.Policies {
		for _, pe := range policyErrors(p.Policy) {
			path := fmt.Sprintf("policies[%d].%s", i, pe.Field)
			e := c.errorAt(path, pe.Value, pe.Rule)
			if _, written := c.pos[path]; c.pos != nil && !written {
				// The value is a default, not something the file says.
				e.Value = pe.Value + " (the default)"
			}
			errs = append(errs, e)
		}
		if j, dup := seen[p.ID]; dup {
			errs = append(errs, c.errorAt(fmt.Sprintf("policies[%d].id", i), strconv.Quote(p.ID), fmt.Sprintf("is already the id of policies[%d]", j)))
			continue
		}
		seen[p.ID] = i
	}
	return errs
}

// policyErrors returns every rule p breaks, as far as they stand on their
// own. sluice.Policy.Validate names the first; each field it names is
// then set aside (an optional field back to its default, an invalid id
// to a valid one, an unknown algorithm to fixed_window without the
// fields that depend on the algorithm) and p judged again. It stops at a
// limit or window, on which the other rules depend, and at a field named
// twice.
func policyErrors(p sluice.Policy) []*policyerr.Error {
	var errs []*policyerr.Error
	named := map[string]bool{}
	for range 16 {
		err := p.Validate()
		if err == nil {
			return errs
		}
		var pe *policyerr.Error
		if !errors.As(err, &pe) {
			return append(errs, &policyerr.Error{Rule: err.Error()})
		}
		if named[pe.Field] {
			return errs
		}
		named[pe.Field] = true
		errs = append(errs, pe)
		if strings.HasPrefix(pe.Field, "priorities") {
			p.Priorities = nil
			continue
		}
		switch pe.Field {
		case "id":
			p.ID = "x"
		case "revision":
			p.Revision = 0
		case "algorithm":
			if p.Window == 0 {
				return errs
			}
			p.Algorithm, p.Burst, p.MaxCost, p.LeaseTTL, p.NearCache, p.LocalQuota = sluice.FixedWindow, 0, 0, 0, false, sluice.LocalQuota{}
			named["burst"], named["max_cost"], named["lease_ttl"], named["near_cache"], named["local_quota"] = true, true, true, true, true
		case "lease_ttl":
			if p.Algorithm == sluice.Concurrency {
				return errs
			}
			p.LeaseTTL = 0
		case "window":
			if p.Algorithm != sluice.Concurrency || p.LeaseTTL == 0 {
				return errs
			}
			p.Window = 0
		case "burst":
			p.Burst = 0
		case "max_cost":
			p.MaxCost = 0
		case "near_cache":
			p.NearCache = false
		case "local_quota", "local_quota.enabled":
			p.LocalQuota = sluice.LocalQuota{}
		case "local_quota.block_time":
			p.LocalQuota.BlockTime = 0
		case "local_quota.max_block":
			p.LocalQuota.MaxBlock = 0
		case "time_zone":
			p.TimeZone = nil
		case "cleanup_grace":
			p.CleanupGrace = 0
		case "dedupe_ttl":
			p.DedupeTTL = 0
		case "dedupe_max":
			p.DedupeMax = 0
		case "max_wait":
			p.MaxWait = 0
		default:
			return errs
		}
	}
	return errs
}

// minSecretLen is the shortest secret subject.New takes, in bytes
// (TestSecretBoundIsSubjects holds the two equal).
const minSecretLen = 16

// validKeyID reports whether subject.New takes id as a key's: the rule is
// subject's, asked of it with a secret long enough.
func validKeyID(id string) bool {
	_, err := subject.New([]subject.Key{{ID: id, Secret: make([]byte, 32)}})
	return err == nil
}

func (c *Config) validateSubjects() []*Error {
	var errs []*Error
	seen := map[string]int{}
	for i, k := range c.Subjects.HMACKeys {
		path := fmt.Sprintf("subjects.hmac_keys[%d]", i)
		switch j, dup := seen[k.ID]; {
		case !validKeyID(k.ID):
			errs = append(errs, c.errorAt(path+".id", strconv.Quote(k.ID), "must be 1 to 16 of a-z 0-9"))
		case dup:
			errs = append(errs, c.errorAt(path+".id", strconv.Quote(k.ID), fmt.Sprintf("is already the id of subjects.hmac_keys[%d]", j)))
		case !validEnvName(k.SecretEnv):
			errs = append(errs, c.errorAt(path+".secret_env", strconv.Quote(k.SecretEnv), envNameRule))
		}
		if _, dup := seen[k.ID]; !dup {
			seen[k.ID] = i
		}
	}
	return errs
}

func (c *Config) validateProxy() []*Error {
	p := c.Proxy
	if p == nil {
		return nil
	}
	var errs []*Error
	if p.Listen == "" {
		errs = append(errs, c.errorAt("proxy.listen", "", "is required: host:port, such as "+DefaultProxyListen))
	} else if rule := checkHostPort(p.Listen, true); rule != "" {
		errs = append(errs, c.errorAt("proxy.listen", strconv.Quote(p.Listen), rule))
	} else if sameAddr(p.Listen, c.Server.Listen) {
		errs = append(errs, c.errorAt("proxy.listen", strconv.Quote(p.Listen), "must differ from server.listen: the proxy has an address of its own"))
	}
	if p.ReadTimeout < time.Second || p.ReadTimeout > time.Hour {
		errs = append(errs, c.errorAt("proxy.read_timeout", p.ReadTimeout.String(), "must be between 1s and 1h"))
	}
	if p.DecisionTimeout < time.Millisecond || p.DecisionTimeout > 10*time.Second {
		errs = append(errs, c.errorAt("proxy.decision_timeout", p.DecisionTimeout.String(), "must be between 1ms and 10s"))
	}
	if !(p.LocalShare > 0 && p.LocalShare <= 1) {
		errs = append(errs, c.errorAt("proxy.local_share", strconv.FormatFloat(p.LocalShare, 'g', -1, 64), "must be more than 0 and at most 1, such as 0.25 for four proxy instances"))
	}
	u, err := url.Parse(p.Upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, c.errorAt("proxy.upstream", strconv.Quote(p.Upstream), "must be an http:// or https:// URL with a host, such as http://127.0.0.1:9000"))
	}
	for i, cidr := range p.TrustedProxies {
		if _, err := netip.ParsePrefix(cidr); err != nil {
			errs = append(errs, c.errorAt(fmt.Sprintf("proxy.trusted_proxies[%d]", i), strconv.Quote(cidr), "must be a CIDR such as 10.0.0.0/8 or ::1/128"))
		}
	}
	if len(p.Routes) == 0 {
		return append(errs, c.errorAt("proxy.routes", "", "at least one route is required"))
	}
	ids := make(map[string]bool, len(c.Policies))
	for _, pol := range c.Policies {
		ids[pol.ID] = true
	}
	matches := make(map[string]int, len(p.Routes))
	for i, r := range p.Routes {
		errs = append(errs, c.validateRoute(i, r, ids, matches)...)
	}
	return errs
}

// validateRoute reports every rule proxy.routes[i] breaks. ids are the
// policy IDs; matches records each route's match.
func (c *Config) validateRoute(i int, r Route, ids map[string]bool, matches map[string]int) []*Error {
	path := fmt.Sprintf("proxy.routes[%d]", i)
	var errs []*Error
	if !strings.HasPrefix(r.Match.PathPrefix, "/") {
		errs = append(errs, c.errorAt(path+".match.path_prefix", strconv.Quote(r.Match.PathPrefix), `must start with "/"`))
	}
	for j, m := range r.Match.Methods {
		if !validMethod(m) {
			errs = append(errs, c.errorAt(fmt.Sprintf("%s.match.methods[%d]", path, j), strconv.Quote(m), "must be an upper-case HTTP method such as GET or POST"))
		}
	}
	// The first matching route wins, so a second route with the same
	// match could never apply; it would also share the first's budgets,
	// which are keyed by the match.
	key := r.Match.Operation()
	if j, dup := matches[key]; dup {
		errs = append(errs, c.errorAt(path+".match", "", fmt.Sprintf("matches what proxy.routes[%d] matches (%s): the first matching route wins, so this one would never apply", j, key)))
	} else {
		matches[key] = i
	}
	if len(r.Policies) == 0 {
		errs = append(errs, c.errorAt(path+".policies", "", "at least one policy id is required"))
	}
	for j, id := range r.Policies {
		if !ids[id] {
			errs = append(errs, c.errorAt(fmt.Sprintf("%s.policies[%d]", path, j), strconv.Quote(id), "is not the id of any policy"))
		}
	}
	if kind, _ := r.SubjectKind(); kind == "" {
		errs = append(errs, c.errorAt(path+".subject", strconv.Quote(r.Subject), "must be one of ip, ip+user_agent, header:<Name>"))
	}
	errs = append(errs, c.validatePriority(path, r)...)
	errs = append(errs, c.validateQueue(path, r)...)
	return append(errs, c.validateSettle(path, r)...)
}

// validatePriority reports every rule a proxy route at path breaks with
// its operation, priority and priority_header: an operation of printable
// ASCII; a class one of its policies declares (or "default"); a header
// field name, believed only from proxy.trusted_proxies, so those must be
// set.
func (c *Config) validatePriority(path string, r Route) []*Error {
	var errs []*Error
	if strings.ContainsFunc(r.Operation, func(c rune) bool { return c < ' ' || c > '~' }) || len(r.Operation) > 256 {
		errs = append(errs, c.errorAt(path+".operation", strconv.Quote(r.Operation), "must be at most 256 characters of printable ASCII"))
	}
	if r.Priority != "" && r.Priority != "default" {
		declared := false
		for _, id := range r.Policies {
			for _, p := range c.Policies {
				_, ok := p.Priorities[r.Priority]
				declared = declared || p.ID == id && ok
			}
		}
		if !declared {
			errs = append(errs, c.errorAt(path+".priority", strconv.Quote(r.Priority), "must be a class one of the route's policies declares under priorities, or default"))
		}
	}
	switch {
	case r.PriorityHeader == "":
	case !httpguts.ValidHeaderFieldName(r.PriorityHeader):
		errs = append(errs, c.errorAt(path+".priority_header", strconv.Quote(r.PriorityHeader), "must be a header field name such as X-Priority"))
	case c.Proxy == nil || len(c.Proxy.TrustedProxies) == 0:
		errs = append(errs, c.errorAt(path+".priority_header", strconv.Quote(r.PriorityHeader), "is believed only from proxy.trusted_proxies, and none are set: a client could name itself critical"))
	}
	return errs
}

func (c *Config) validateEnvoy() *Error {
	e := c.Envoy
	if e == nil {
		return nil
	}
	if rule := checkHostPort(e.Listen, true); rule != "" {
		return c.errorAt("envoy.listen", strconv.Quote(e.Listen), rule)
	}
	if sameAddr(e.Listen, c.Server.Listen) || c.Proxy != nil && sameAddr(e.Listen, c.Proxy.Listen) {
		return c.errorAt("envoy.listen", strconv.Quote(e.Listen), "must differ from server.listen and proxy.listen")
	}
	if len(e.Configs) == 0 {
		return c.errorAt("envoy.configs", "", "at least one file pattern is required")
	}
	for i, pat := range e.Configs {
		if _, err := filepath.Match(pat, ""); pat == "" || err != nil {
			return c.errorAt(fmt.Sprintf("envoy.configs[%d]", i), strconv.Quote(pat), "must be a file path or glob pattern such as ratelimit/*.yaml")
		}
	}
	for _, b := range []struct {
		field string
		v     int64
	}{{"max_descriptors", e.MaxDescriptors}, {"max_entries", e.MaxEntries}} {
		if b.v < 0 || b.v > 10000 {
			return c.errorAt("envoy."+b.field, strconv.FormatInt(b.v, 10), "must be between 1 and 10000")
		}
	}
	return nil
}

// Operation is the name the proxy gives the budgets of a route with this
// match, e.g. "POST /login" or "* /api": the methods and the cleaned path
// prefix, as httplimit.Route names them by default.
func (m Match) Operation() string {
	methods := "*"
	if len(m.Methods) > 0 {
		methods = strings.Join(m.Methods, ",")
	}
	prefix := m.PathPrefix
	if prefix != "/" {
		prefix = strings.TrimSuffix(pathpkg.Clean(prefix), "/")
	}
	return methods + " " + prefix
}

// sameAddr reports whether two listen addresses name the same port on
// the same host; port 0 always picks a fresh one.
func sameAddr(a, b string) bool {
	ha, pa, err1 := net.SplitHostPort(a)
	hb, pb, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil || pa == "0" || pa != pb {
		return false
	}
	wildcard := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	return ha == hb || wildcard(ha) || wildcard(hb)
}

// checkHostPort returns the rule addr breaks, or "". A listen address may
// leave the host empty (every interface) and use port 0 (any free port).
func checkHostPort(addr string, listen bool) string {
	const rule = "must be host:port, such as 127.0.0.1:8080"
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return rule
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return rule + "; the port must be a number between 0 and 65535"
	}
	if !listen && (host == "" || n == 0) {
		return rule + " with a host and a port between 1 and 65535"
	}
	return ""
}

const envNameRule = "must be the name of an environment variable: A-Z a-z 0-9 _, not starting with a digit"

func validEnvName(s string) bool {
	if s == "" || ('0' <= s[0] && s[0] <= '9') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		if c := m[i]; c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}
