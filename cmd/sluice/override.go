package main

import (
	"context"
	"encoding/json"
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
	entry := func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return fmt.Errorf("%q: want KEY=VALUE", s)
		}
		envoy.Entries = append(envoy.Entries, checkapi.EnvoyEntry{Key: k, Value: v})
		return nil
	}
	fs.Func("descriptor", "with --envoy-domain: one `KEY=VALUE` entry of the descriptor, as Envoy sends it (repeat, in order)", entry)
	fs.Func("bucket", "with --rlqs-domain: one `KEY=VALUE` entry of the bucket id (repeat for each key)", entry)
	var rlqsDomain string
	fs.StringVar(&rlqsDomain, "rlqs-domain", "", "in place of --subject: the `DOMAIN` of Envoy's quota service (envoy.rlqs) of the bucket --bucket names (--policy may then be left out)")
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
	if rlqsDomain != "" {
		f.body.RLQS = &checkapi.RLQSBucket{Domain: rlqsDomain, Bucket: map[string]string{}}
		for _, e := range envoy.Entries {
			f.body.RLQS.Bucket[e.Key] = e.Value
		}
	}
	if envoy.Domain != "" || len(envoy.Entries) > 0 && rlqsDomain == "" {
		f.body.Envoy = &envoy
	}
	if proxyRoute || proxy.IP != "" || proxy.Header != "" {
		f.body.Proxy = &proxy
	}
	if msg := f.usage(verb, proxyRoute, len(envoy.Entries)); msg != "" {
		return nil, &exitError{code: 2, err: &usageError{msg: "override " + verb + ": " + msg, usage: "Usage: " + overrideSynopsis + "\n"}}
	}
	return f, nil
}

// usage returns what is wrong with the flags of verb ("" when nothing
// is), given whether --proxy-route was set and how many --descriptor or
// --bucket entries were.
func (f *overrideFlags) usage(verb string, proxyRoute bool, entries int) string {
	b, forms := f.body, f.body.Forms()
	switch {
	case f.tokenEnv != "" && f.token != "":
		return "set --token-env or --token, not both"
	case verb == "list" && forms > 0:
		return "lists show notes, never subjects: leave --subject, --envoy-domain, --proxy-route and --rlqs-domain out"
	case forms > 1:
		return "name the subject one way: --subject, --envoy-domain, --proxy-route or --rlqs-domain, for set and rm"
	case b.Proxy != nil && (!proxyRoute || (b.Proxy.IP == "") == (b.Proxy.Header == "")):
		return "--proxy-route needs one of --client-ip and --header-value, and they need --proxy-route"
	case b.Envoy != nil && (b.Envoy.Domain == "" || entries == 0), b.RLQS != nil && (entries == 0 || len(b.RLQS.Bucket) != entries):
		return "--envoy-domain needs at least one --descriptor KEY=VALUE, --rlqs-domain one --bucket KEY=VALUE (each key once); and they need their domain"
	case verb != "list" && forms == 0, b.Subject != "" && b.Policy == "":
		return "needs --policy and --subject (or --envoy-domain and --descriptor, --proxy-route, or --rlqs-domain and --bucket)"
	case verb == "set" && b.Limit < 1:
		return "needs --limit, at least 1 (rm removes an override)"
	case verb != "set" && (b.Limit != 0 || b.Burst != 0 || b.Window != "" || b.Note != ""):
		return "--limit, --burst, --window and --note apply to set only"
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
