package config

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"
)

// DefaultListen is the address sluice serve listens on when the config
// names none.
const DefaultListen = "127.0.0.1:8080"

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

func (d *decoder) server(s *Server, n *yaml.Node) {
	m, ok := d.mapping("server", n, "listen", "tls", "auth", "decision_timeout")
	if !ok {
		return
	}
	d.str("server.listen", m["listen"], &s.Listen)
	d.duration("server.decision_timeout", m["decision_timeout"], &s.DecisionTimeout)
	if v := m["tls"]; v != nil {
		if tm, ok := d.mapping("server.tls", v, "cert_file", "key_file"); ok {
			s.TLS = &TLS{}
			d.str("server.tls.cert_file", tm["cert_file"], &s.TLS.CertFile)
			d.str("server.tls.key_file", tm["key_file"], &s.TLS.KeyFile)
		}
	}
	v := m["auth"]
	if v == nil {
		return
	}
	am, ok := d.mapping("server.auth", v, "tokens")
	if !ok {
		return
	}
	s.Auth = &Auth{}
	if am["tokens"] == nil {
		return
	}
	items, ok := d.sequence("server.auth.tokens", am["tokens"])
	if !ok {
		return
	}
	s.Auth.Tokens = make([]Token, len(items))
	for i, item := range items {
		d.token(fmt.Sprintf("server.auth.tokens[%d]", i), item, &s.Auth.Tokens[i])
	}
}

func (d *decoder) token(path string, n *yaml.Node, t *Token) {
	m, ok := d.mapping(path, n, "id", "secret_env", "scopes")
	if !ok {
		return
	}
	d.required(path, n, m, "id", "secret_env", "scopes")
	d.str(path+".id", m["id"], &t.ID)
	d.str(path+".secret_env", m["secret_env"], &t.SecretEnv)
	d.strs(path+".scopes", m["scopes"], &t.Scopes)
}
