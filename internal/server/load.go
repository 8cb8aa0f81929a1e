package server

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/envoy/rules"
	"github.com/sluicehq/sluice/internal/wiring"
	"github.com/sluicehq/sluice/subject"
)

// Errors is several problems found at once, each standing on its own
// (a command prints one per line).
type Errors []error

func (l Errors) Error() string {
	msgs := make([]string, len(l))
	for i, err := range l {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "\n")
}

func (l Errors) Unwrap() []error { return l }

// loaded is a parsed and validated configuration: the config file and,
// with an envoy section, the rules files it names.
type loaded struct {
	cfg      *config.Config
	envoy    *rules.Config // nil without an envoy section
	hash     string        // SHA-256 over every file read
	files    []string      // config file first; nil for the built-in example
	warnings []string      // what loads but never acts, by file and line
}

// Validate reports everything Run would refuse in the config at path: its
// rules, what it needs from the environment (secrets, TLS files, a Redis
// URL the client accepts) and the Envoy rules files it names, every
// problem at once (as Errors when there are several). err is nil when Run
// can start with it; warnings are what Run would serve but what never
// acts (an Envoy rule or RLQS matcher that can never match, a replaces
// naming no rule), as envoyproxy/ratelimit loads such files too. With
// strict, warnings are refused: err names each.
func Validate(path string, getenv func(string) string, strict bool) (warnings []string, err error) {
	l, err := load(path, getenv)
	switch {
	case err != nil:
		return nil, err
	case strict && len(l.warnings) > 0:
		return nil, errors.New("validate --strict: " + strings.Join(l.warnings, "\n"))
	}
	return l.warnings, nil
}

// load reads the config at path (the built-in example when path is "")
// and the Envoy rules files it names, and checks what serve would refuse
// (see preflight), reporting every problem it finds. Relative
// envoy.configs patterns are relative to the config file's directory.
func load(path string, getenv func(string) string) (*loaded, error) {
	if path == "" {
		return &loaded{cfg: config.Default(), hash: "built-in"}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cfg, err := parseConfig(path, data)
	if cfg == nil {
		return nil, err // unreadable, or not a mapping: nothing more to check
	}
	// What serve would refuse after parsing, reported even when the file
	// breaks rules too, in one list sorted by line: secrets missing from
	// the environment, a Redis URL the client rejects, TLS files that do
	// not load, Envoy rules files that do not load.
	l := &loaded{cfg: cfg, files: []string{path}}
	var rulesErr error
	if cfg.Envoy != nil && len(cfg.Envoy.Configs) > 0 {
		l.envoy, rulesErr = rules.Load(envoyPatterns(cfg, path))
		rulesErr = rulesErrors(rulesErr, path, cfg.Line("envoy.configs"))
	}
	if rulesErr == nil && err == nil {
		if _, oerr := wiring.EnvoyOverrides(cfg, l.envoy, subject.Unkeyed()); oerr != nil {
			rulesErr = fmt.Errorf("%s: %w", path, oerr)
		} else if _, oerr := wiring.ProxyOverrides(cfg, subject.Unkeyed()); oerr != nil {
			rulesErr = fmt.Errorf("%s: %w", path, oerr)
		}
	}
	if err := byLine(err, beyond(err, preflight(cfg, getenv, path)), rulesErr); err != nil {
		return nil, err
	}
	for _, w := range cfg.Warnings() {
		l.warnings = append(l.warnings, fmt.Sprintf("%s: %v", path, w))
	}
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s", len(data), data)
	if l.envoy != nil {
		h.Write([]byte(l.envoy.Hash()))
		l.files = append(l.files, l.envoy.Files()...)
		for _, w := range l.envoy.Warnings() {
			l.warnings = append(l.warnings, fmt.Sprintf("envoy.configs (%s line %d): %v", path, cfg.Line("envoy.configs"), w))
		}
	}
	l.hash = hex.EncodeToString(h.Sum(nil))
	return l, nil
}

// rulesErrors returns each problem of the Envoy rules files (err, from
// rules.Load) as an error of its own about line, envoy.configs' in
// the config at path, keeping rules's order (by file and line).
func rulesErrors(err error, path string, line int) error {
	if err == nil {
		return nil
	}
	var list Errors
	for _, e := range flattenRules(err) {
		list = append(list, &lineError{line: line, err: fmt.Errorf("envoy.configs (%s line %d): %w", path, line, e)})
	}
	return joinErrors(list)
}

// flattenRules returns the *rules.Error of an rules.Errors, or
// err alone.
func flattenRules(err error) []error {
	es, ok := errors.AsType[rules.Errors](err)
	if !ok {
		return []error{err}
	}
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// lineError is an error about the config file's line: what byLine sorts
// it by.
type lineError struct {
	line int
	err  error
}

func (e *lineError) Error() string { return e.err.Error() }
func (e *lineError) Unwrap() error { return e.err }

// lineOf returns the config file's line err is about, 0 when unknown.
func lineOf(err error) int {
	if le, ok := errors.AsType[*lineError](err); ok {
		return le.line
	}
	if ce, ok := errors.AsType[*config.Error](err); ok {
		return ce.Line
	}
	return 0
}

// byLine is joinErrors with the errors sorted by the line they are
// about; those without one keep their order, after the others.
func byLine(errs ...error) error {
	all := joinErrors(errs...)
	list, ok := all.(Errors)
	if !ok {
		return all
	}
	slices.SortStableFunc(list, func(a, b error) int {
		la, lb := lineOf(a), lineOf(b)
		switch {
		case la == lb:
			return 0
		case la == 0:
			return 1
		case lb == 0:
			return -1
		}
		return cmp.Compare(la, lb)
	})
	return list
}

// beyond returns the errors of env that the file's errors (fileErr) do
// not already cover: a field that did not decode is left at its zero
// value, and what the environment checks say of that zero would repeat
// the decoding error.
func beyond(fileErr, env error) error {
	var covered []string
	for _, e := range flatten(fileErr) {
		if ce, ok := errors.AsType[*config.Error](e); ok && ce.Path != "" {
			covered = append(covered, ce.Path)
		}
	}
	var out Errors
	for _, e := range flatten(env) {
		ce, ok := errors.AsType[*config.Error](e)
		if ok && slices.ContainsFunc(covered, func(p string) bool { return related(p, ce.Path) }) {
			continue
		}
		out = append(out, e)
	}
	return joinErrors(out)
}

// related reports whether one of the config paths a and b holds the
// other (store.redis holds store.redis.url; policies[1] holds
// policies[1].window).
func related(a, b string) bool {
	if len(a) > len(b) {
		a, b = b, a
	}
	return a == b || strings.HasPrefix(b, a+".") || strings.HasPrefix(b, a+"[")
}

// flatten returns err's errors: none for nil, the list of an Errors, or
// err alone.
func flatten(err error) []error {
	if err == nil {
		return nil
	}
	if list, ok := errors.AsType[Errors](err); ok {
		return list
	}
	return []error{err}
}

// joinErrors flattens errs (each nil, one error or Errors) into nil, one
// error or Errors.
func joinErrors(errs ...error) error {
	var all Errors
	for _, e := range errs {
		var list Errors
		switch {
		case e == nil:
		case errors.As(e, &list):
			all = append(all, list...)
		default:
			all = append(all, e)
		}
	}
	switch len(all) {
	case 0:
		return nil
	case 1:
		return all[0]
	}
	return all
}

// envoyPatterns returns cfg's envoy.configs with relative patterns
// joined to the directory of the config file at path.
func envoyPatterns(cfg *config.Config, path string) []string {
	pats := make([]string, len(cfg.Envoy.Configs))
	for i, p := range cfg.Envoy.Configs {
		if !filepath.IsAbs(p) && path != "" {
			p = filepath.Join(filepath.Dir(path), p)
		}
		pats[i] = p
	}
	return pats
}

// parseConfig parses data, the config read from path. Every error it finds
// names the file, so that each line of a report stands on its own. A config
// that decoded but breaks rules comes back with the error (see
// config.Parse).
func parseConfig(path string, data []byte) (*config.Config, error) {
	cfg, err := config.Parse(bytes.NewReader(data))
	var errs config.Errors
	if err != nil && errors.As(err, &errs) {
		list := make(Errors, len(errs))
		for i, e := range errs {
			list[i] = fmt.Errorf("%s: %w", path, e)
		}
		return cfg, list
	}
	if err != nil {
		return cfg, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// preflight reports everything serve would refuse in a config that
// parsed: secrets missing from the environment (HMAC keys, check API
// tokens, the Redis password), a Redis URL the client cannot use, and
// TLS files that do not load. Validate runs it too, so the two never
// disagree. source prefixes each error (the file name); nil when serve
// can start.
func preflight(cfg *config.Config, getenv func(string) string, source string) error {
	var errs Errors
	add := func(err error) {
		if err == nil {
			return
		}
		switch list := err.(type) {
		case config.Errors:
			for _, e := range list {
				errs = append(errs, e)
			}
		case Errors:
			errs = append(errs, list...)
		default:
			errs = append(errs, err)
		}
	}
	_, err := cfg.HMACKeys(getenv)
	add(err)
	_, err = cfg.Tokens(getenv)
	add(err)
	if t := cfg.Server.TLS; t != nil && t.CertFile != "" && t.KeyFile != "" {
		_, err := tlsConfig(cfg)
		add(err)
	}
	if r := cfg.Store.Redis; cfg.Store.Type == config.StoreRedis && r != nil {
		add(redisPreflight(cfg, getenv))
	}
	if source != "" {
		for i, err := range errs {
			errs[i] = fmt.Errorf("%s: %w", source, err)
		}
	}
	return joinErrors(errs)
}

// redisPreflight checks store.redis: its password in the environment and
// a URL the client accepts.
func redisPreflight(cfg *config.Config, getenv func(string) string) error {
	r := cfg.Store.Redis
	_, err := r.Password(getenv)
	if ce := (*config.Error)(nil); errors.As(err, &ce) && ce.Line == 0 {
		ce.Line = cfg.Line(ce.Path)
	}
	if r.URL != "" && cfg.Validate() == nil {
		// Only once the config's own URL rules pass: they say more.
		if _, uerr := redis.ParseURL(r.URL); uerr != nil {
			return joinErrors(err, &config.Error{Path: "store.redis.url", Value: strconv.Quote(r.URL), Rule: strings.TrimPrefix(uerr.Error(), "redis: "), Line: cfg.Line("store.redis.url")})
		}
	}
	return err
}

// tlsConfig loads server.tls's certificate and key; nil without TLS.
func tlsConfig(cfg *config.Config) (*tls.Config, error) {
	t := cfg.Server.TLS
	if t == nil {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, &config.Error{Path: "server.tls", Rule: "cannot load the certificate and key: " + err.Error(), Line: cfg.Line("server.tls")}
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}
