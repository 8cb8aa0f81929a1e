package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/wiring"
)

const overrideSynopsis = "sluice override set|list|rm [--url URL] [--token-env NAME | --token TOKEN] --policy ID [--subject SUBJECT | --envoy-domain DOMAIN --descriptor KEY=VALUE... | --proxy-route N (--client-ip IP | --header-value V) | --rlqs-domain DOMAIN --bucket KEY=VALUE...] [--limit N [--burst N] [--window D] [--note TEXT]]"

// overrideFlags are the flags of sluice override: the admin API's own
// OverrideRequest (checkapi), one flag per field.
type overrideFlags struct {
	base, tokenEnv, token string
	timeout               time.Duration
	body                  checkapi.OverrideRequest
}

// override runs sluice override set|list|rm against a server's admin API
// (PUT, GET, DELETE /v1/overrides). It prints the entries the server
// answers (policy, note, numbers: never a subject) and exits 0, or 2
// with the server's reason.
func (a *app) override(ctx context.Context, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fmt.Fprintln(a.stdout, "Usage: "+overrideSynopsis)
			return nil
		}
		return &exitError{code: 2, err: &usageError{msg: "override needs set, list or rm", usage: "Usage: " + overrideSynopsis + "\n"}}
	}
	verb := args[0]
	method := map[string]string{"set": http.MethodPut, "list": http.MethodGet, "rm": http.MethodDelete}[verb]
	if method == "" {
		return &exitError{code: 2, err: &usageError{msg: fmt.Sprintf("override: unknown action %q: want set, list or rm", verb), usage: "Usage: " + overrideSynopsis + "\n"}}
	}
	f, err := a.overrideFlags(verb, args[1:])
	if f == nil {
		return err
	}
	token, err := wiring.Token(a.getenv, f.tokenEnv, f.token)
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("override: %w", err)}
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	target := strings.TrimSuffix(f.base, "/") + checkapi.OverridesPath
	var body any = f.body
	if method == http.MethodGet {
		body = nil
		if f.body.Policy != "" {
			target += "?policy=" + url.QueryEscape(f.body.Policy)
		}
	}
	resp, err := wiring.Send(ctx, http.DefaultClient, method, target, body, token)
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("override: %w", err)}
	}
	defer resp.Body.Close()
	return a.printOverrides(verb, resp, target)
}

// overrideFlags parses the flags of verb. It returns nil and the error to
// return for a usage error or after -h (errHelp, wrapped).
func (a *app) overrideFlags(verb string, args []string) (*overrideFlags, error) {
	f := &overrideFlags{}
	fs := newFlagSet("override " + verb)
	fs.StringVar(&f.base, "url", "http://127.0.0.1:8080", "the server's base `URL`")
	fs.StringVar(&f.tokenEnv, "token-env", "", "send the admin-scope bearer token held by the environment variable `NAME`")
	fs.StringVar(&f.token, "token", "", "send this admin-scope bearer `TOKEN` (--token-env keeps it out of the process list)")
	fs.StringVar(&f.body.Policy, "policy", "", "the policy `ID` (list: only this policy's)")
	fs.StringVar(&f.body.Subject, "subject", "", "whose numbers to set or remove; the server pseudonymizes it")
	var envoy checkapi.EnvoyDescriptor
	fs.StringVar(&envoy.Domain, "envoy-domain", "", "in place of --subject: the Envoy service's `DOMAIN` of the descriptor that names the subject (--policy may then be left out)")
	var proxy checkapi.ProxyClient
	proxyRoute := false
	fs.Func("proxy-route", "in place of --subject: the index `N` of the proxy route whose client --client-ip or --header-value names", func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return fmt.Errorf("%q: want a route index, 0 or more", s)
		}
		proxy.Route, proxyRoute = n, true
		return nil
	})
	fs.StringVar(&proxy.IP, "client-ip", "", "with --proxy-route: the client's `IP` address, masked as the route masks it")
	fs.StringVar(&proxy.Header, "header-value", "", "with --proxy-route: the `VALUE` of the route's subject header")
	fs.Func("descriptor", "with --envoy-domain: one `KEY=VALUE` entry of the descriptor, as Envoy sends it (repeat, in order)", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return fmt.Errorf("%q: want KEY=VALUE", s)
		}
		envoy.Entries = append(envoy.Entries, checkapi.EnvoyEntry{Key: k, Value: v})
		return nil
	})
	rlqsBucket := rlqsFlags(fs)
	fs.Int64Var(&f.body.Limit, "limit", 0, "the subject's limit (set)")
	fs.Int64Var(&f.body.Burst, "burst", 0, "the subject's burst, token_bucket and gcra only (set; default: the limit)")
	var window time.Duration
	fs.DurationVar(&window, "window", 0, "the subject's window (set; default: the policy's)")
	fs.StringVar(&f.body.Note, "note", "", "what lists show in place of the subject (set)")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "give up after this long")
	if err := a.parseFlags(fs, overrideSynopsis, args); err != nil {
		return nil, &exitError{code: 2, err: err} // errHelp after -h: run answers nil
	}
	if window != 0 {
		f.body.Window = window.String()
	}
	if envoy.Domain != "" || len(envoy.Entries) > 0 {
		f.body.Envoy = &envoy
	}
	if proxyRoute || proxy.IP != "" || proxy.Header != "" {
		f.body.Proxy = &proxy
	}
	if rlqsBucket.Domain != "" || len(rlqsBucket.Bucket) > 0 {
		f.body.RLQS = rlqsBucket
	}
	if err := subjectFlags(f.body, verb); err != "" {
		return nil, &exitError{code: 2, err: &usageError{msg: "override " + verb + ": " + err, usage: "Usage: " + overrideSynopsis + "\n"}}
	}
	bad := func(msg string) error {
		return &exitError{code: 2, err: &usageError{msg: "override " + verb + ": " + msg, usage: "Usage: " + overrideSynopsis + "\n"}}
	}
	switch {
	case f.tokenEnv != "" && f.token != "":
		return nil, bad("set --token-env or --token, not both")
	case f.body.Proxy != nil && (verb == "list" || f.body.Subject != "" || f.body.Envoy != nil):
		return nil, bad("--proxy-route with --client-ip or --header-value names a subject in place of --subject or --envoy-domain, for set and rm")
	case f.body.Proxy != nil && (!proxyRoute || (proxy.IP == "") == (proxy.Header == "")):
		return nil, bad("--proxy-route needs one of --client-ip and --header-value, and they need --proxy-route")
	case f.body.Envoy != nil && (verb == "list" || f.body.Subject != ""):
		return nil, bad("--envoy-domain and --descriptor name a subject in place of --subject, for set and rm")
	case f.body.Envoy != nil && (envoy.Domain == "" || len(envoy.Entries) == 0):
		return nil, bad("--envoy-domain needs at least one --descriptor KEY=VALUE, and --descriptor needs --envoy-domain")
	case verb != "list" && f.body.Envoy == nil && f.body.Proxy == nil && f.body.RLQS == nil && (f.body.Policy == "" || f.body.Subject == ""):
		return nil, bad("needs --policy and --subject (or --envoy-domain and --descriptor, --proxy-route, or --rlqs-domain and --bucket)")
	case verb == "set" && f.body.Limit < 1:
		return nil, bad("needs --limit, at least 1 (rm removes an override)")
	case verb != "set" && (f.body.Limit != 0 || f.body.Burst != 0 || window != 0 || f.body.Note != ""):
		return nil, bad("--limit, --burst, --window and --note apply to set only")
	case verb == "list" && f.body.Subject != "":
		return nil, bad("lists show notes, never subjects: leave --subject out")
	}
	return f, nil
}

// rlqsFlags declares the rlqs form's flags on fs: --rlqs-domain and the
// repeated --bucket KEY=VALUE; the bucket they name fills in as fs parses.
func rlqsFlags(fs *flag.FlagSet) *checkapi.RLQSBucket {
	b := &checkapi.RLQSBucket{}
	fs.StringVar(&b.Domain, "rlqs-domain", "", "in place of --subject: the `DOMAIN` of Envoy's quota service (envoy.rlqs) whose bucket --bucket names (--policy may then be left out)")
	fs.Func("bucket", "with --rlqs-domain: one `KEY=VALUE` entry of the bucket id (repeat for each key)", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return errors.New("want KEY=VALUE")
		}
		if _, dup := b.Bucket[k]; dup {
			return fmt.Errorf("key %q given twice", k)
		}
		if b.Bucket == nil {
			b.Bucket = map[string]string{}
		}
		b.Bucket[k] = v
		return nil
	})
	return b
}

// subjectFlags checks the rlqs form's flags: one of the subject forms,
// for set and rm, with its domain and at least one entry. It returns the
// usage error's message, "" when there is none.
func subjectFlags(b checkapi.OverrideRequest, verb string) string {
	switch {
	case b.RLQS == nil:
		return ""
	case verb == "list" || b.Subject != "" || b.Envoy != nil || b.Proxy != nil:
		return "--rlqs-domain and --bucket name a bucket in place of --subject, --envoy-domain or --proxy-route, for set and rm"
	case b.RLQS.Domain == "" || len(b.RLQS.Bucket) == 0:
		return "--rlqs-domain needs at least one --bucket KEY=VALUE, and --bucket needs --rlqs-domain"
	}
	return ""
}

// printOverrides prints the entries of the answer in resp, one a line,
// and returns nil for a 200, exit status 2 with the server's reason
// otherwise.
func (a *app) printOverrides(verb string, resp *http.Response, target string) error {
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("override: read answer: %w", err)}
	}
	var list checkapi.OverrideList
	if err := json.Unmarshal(raw, &list); err != nil {
		return &exitError{code: 2, err: fmt.Errorf("override: %s from %s: %s", resp.Status, target, strings.TrimSpace(string(raw)))}
	}
	if resp.StatusCode != http.StatusOK {
		return &exitError{code: 2, err: fmt.Errorf("override %s: %s: %s", verb, resp.Status, list.Error)}
	}
	if verb == "rm" {
		fmt.Fprintln(a.stdout, "removed")
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POLICY\tLIMIT\tBURST\tWINDOW\tSOURCE\tNOTE")
	for _, e := range list.Overrides {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", e.Policy, e.Limit, e.Burst, e.Window, e.Source, e.Note)
	}
	return tw.Flush()
}
