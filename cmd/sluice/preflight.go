package main

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/server"
)

// errorList is several errors; exitCode reports each on a line of its
// own.
type errorList []error

func (l errorList) Error() string {
	msgs := make([]string, len(l))
	for i, err := range l {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "\n")
}

func (l errorList) Unwrap() []error { return l }

// parseConfig parses data, the config read from path. Every error it finds
// names the file, so that each line of a report stands on its own. A config
// that decoded but breaks rules comes back with the error (see
// config.Parse).
func parseConfig(path string, data []byte) (*config.Config, error) {
	cfg, err := config.Parse(bytes.NewReader(data))
	var errs config.Errors
	if err != nil && errors.As(err, &errs) {
		list := make(errorList, len(errs))
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
// TLS files that do not load. validate runs it too, so the two never
// disagree. source prefixes each error (the file name); nil when serve
// can start.
func preflight(cfg *config.Config, getenv func(string) string, source string) error {
	var errs errorList
	add := func(err error) {
		if err == nil {
			return
		}
		if list, ok := err.(config.Errors); ok {
			for _, e := range list {
				errs = append(errs, e)
			}
			return
		}
		errs = append(errs, err)
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
		_, err := r.Password(getenv)
		if ce := (*config.Error)(nil); errors.As(err, &ce) && ce.Line == 0 {
			ce.Line = cfg.Line(ce.Path)
		}
		add(err)
		if r.URL != "" && cfg.Validate() == nil {
			// Only once the config's own URL rules pass: they say more.
			if _, err := redis.ParseURL(r.URL); err != nil {
				add(&config.Error{Path: "store.redis.url", Value: strconv.Quote(r.URL), Rule: strings.TrimPrefix(err.Error(), "redis: "), Line: cfg.Line("store.redis.url")})
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	if source != "" {
		for i, err := range errs {
			errs[i] = fmt.Errorf("%s: %w", source, err)
		}
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return errs
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

// checkAPITokens returns server.auth's tokens for server.Options, warning
// when the check API is open on an address other hosts can reach.
func (a *app) checkAPITokens(cfg *config.Config, log *slog.Logger) ([]server.Token, error) {
	resolved, err := cfg.Tokens(a.getenv)
	if err != nil {
		return nil, err
	}
	if len(resolved) == 0 {
		if !loopback(cfg.Server.Listen) {
			log.Warn("server.auth is not configured and server.listen is not a loopback address: anyone who can reach it can spend and refund any subject's budget and read the dashboard at /ui; configure server.auth.tokens", "listen", cfg.Server.Listen)
		}
		return nil, nil
	}
	tokens := make([]server.Token, len(resolved))
	for i, t := range resolved {
		tokens[i] = server.Token{ID: t.ID, Secret: t.Secret, Scopes: t.Scopes}
	}
	return tokens, nil
}

// loopback reports whether a listen address accepts only local
// connections.
func loopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	addr, err := netip.ParseAddr(host)
	return err == nil && addr.IsLoopback()
}

// newLogger returns serve's logger: format "text" (logfmt) or "json", at
// level.
func newLogger(w interface{ Write([]byte) (int, error) }, level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, &usageError{msg: fmt.Sprintf("--log-level %q: must be debug, info, warn or error", level), usage: usage}
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, &usageError{msg: fmt.Sprintf("--log-format %q: must be text or json", format), usage: usage}
}
