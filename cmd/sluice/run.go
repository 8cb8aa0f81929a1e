package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clock"
	"github.com/sluicehq/sluice/internal/server"
)

// The build's stamps (-ldflags "-X main.version=v1.2.3 -X main.commit=…"):
// make build and the Dockerfile set them; "" falls back (versionText).
var version, commit, modified = "", "", ""

const usage = `sluice is a distributed rate limiter.

Usage:
  ` + serveSynopsis + `
        Serve the HTTP check API and /metrics, and with a proxy: section
        the rate-limiting reverse proxy on proxy.listen. Without --config,
        serve a built-in example config on 127.0.0.1:8080 with the
        embedded store.
  ` + validateSynopsis + `
        Check a config file, and the environment serve would read (secrets,
        TLS files); print "ok" or every line-numbered reason.
  ` + checkSynopsis + `
        Ask a running server once and print its JSON answer. Exits 0 when
        allowed, 1 when denied, 2 otherwise.
  ` + overrideSynopsis + `
        Set, list or remove a subject's numbers of one policy at run time
        (a tenant's plan) through a server's admin API, with a token of
        the admin scope. Lists show notes, never subjects.
  sluice bench [--store memory|redis --redis-url URL | --url URL] [--policy-algorithm ALG]
               [--limit N] [--window D] [--subjects N] [--callers N] [--duration D] [--json]
        Load-test a store and policy, or a running server, and print
        decisions/s, outcome counts and latency quantiles. Against Redis
        it uses a key prefix of its own and deletes its keys at the end.
  sluice simulate [--pattern NAME | --csv FILE] [--policy ALG[:LIMIT/WINDOW[:BURST]]]...
                  [--rate R] [--duration D] [--out FILE.svg] | --accuracy DIR
                  | --local-quota [--instances N]
        Run a traffic pattern (poisson, bursts, boundary, sliding_worst,
        ramp, post_hoc: estimates settled later; or a CSV's timestamps)
        through policies on a virtual clock with the real engine; print
        how each admitted against "at most limit in any window", and
        chart it. With no --policy, all five algorithms at 10 per 10s.
        --local-quota: several Limiters with local quota on one store.
  sluice version
        Print the version, the commit it was built from and whether
        that tree was modified.
  sluice help [COMMAND]
        Print this help, or the flags of a command.

Run "sluice help COMMAND" or "sluice COMMAND --help" for the flags of a
command.
`

// Synopses of the commands, shared by the help and the usage errors.
const (
	serveSynopsis    = "sluice serve [--config FILE] [--log-level LEVEL] [--log-format text|json]"
	validateSynopsis = "sluice validate [--strict] --config FILE"
	checkSynopsis    = "sluice check [--url URL] [--token-env NAME] --policy ID --subject SUBJECT [--cost N] [--refund] [--release LEASE_ID]"
)

// app is one invocation of sluice; tests replace its environment.
type app struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	clock          sluice.Clock
}

// run executes the command line args (without the program name). It
// returns nil on success; exitCode maps its errors to exit statuses.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	a := &app{stdout: stdout, stderr: stderr, getenv: os.Getenv, clock: clock.NewMonotonic()}
	if err := a.run(ctx, args); !errors.Is(err, errHelp) {
		return err
	}
	return nil
}

func (a *app) run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return &usageError{msg: "no command given", usage: usage}
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return a.serve(ctx, rest)
	case "validate":
		return a.validate(rest)
	case "check":
		return a.check(ctx, rest)
	case "override":
		return a.override(ctx, rest)
	case "bench":
		return a.bench(ctx, rest)
	case "simulate":
		return a.simulate(rest)
	case "version":
		if len(rest) > 0 {
			return &usageError{msg: "version takes no arguments", usage: usage}
		}
		bi, _ := debug.ReadBuildInfo()
		io.WriteString(a.stdout, versionText(stamps{version, commit, modified}, bi))
		return nil
	case "help", "-h", "-help", "--help":
		switch {
		case len(rest) == 0:
			io.WriteString(a.stdout, usage)
			return nil
		case len(rest) > 1:
			return &usageError{msg: "help takes at most one command", usage: usage}
		}
		switch rest[0] {
		case "serve", "validate", "check", "override", "bench", "simulate":
			return a.run(ctx, []string{rest[0], "--help"})
		case "version", "help":
			io.WriteString(a.stdout, usage)
			return nil
		}
		return &usageError{msg: fmt.Sprintf("help: unknown command %q", rest[0]), usage: usage}
	}
	return &usageError{msg: fmt.Sprintf("unknown command %q", cmd), usage: usage}
}

// usageError is a command line that makes no sense. Exit status 2.
type usageError struct {
	msg   string
	usage string
}

func (e *usageError) Error() string { return e.msg }

// exitError carries a specific exit status. A nil err exits silently:
// the command has already said what it had to.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// exitCode reports err on stderr and returns the process's exit status.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "sluice: %s\n\n%s", ue.msg, ue.usage)
		return 2
	}
	var list server.Errors
	if errors.As(err, &list) {
		for _, e := range list {
			fmt.Fprintf(stderr, "sluice: %v\n", e)
		}
		return 1
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(stderr, "sluice: %v\n", ee.err)
		}
		return ee.code
	}
	fmt.Fprintf(stderr, "sluice: %v\n", err)
	return 1
}

// newFlagSet returns a flag set for cmd whose errors become usage errors
// (see parseFlags).
func newFlagSet(cmd string) *flag.FlagSet {
	fs := flag.NewFlagSet("sluice "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parseFlags parses args into fs. It returns errHelp after printing the
// flags for -h (which run answers with nil, wrapped or not), and a usage
// error for bad flags or stray arguments.
func (a *app) parseFlags(fs *flag.FlagSet, synopsis string, args []string) error {
	flagUsage := func() string {
		var b strings.Builder
		fmt.Fprintf(&b, "Usage: %s\n\nFlags:\n", synopsis)
		fs.SetOutput(&b)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
		return b.String()
	}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		io.WriteString(a.stdout, flagUsage())
		return errHelp
	case err != nil:
		return &usageError{msg: err.Error(), usage: flagUsage()}
	case fs.NArg() > 0:
		return &usageError{msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0)), usage: flagUsage()}
	}
	return nil
}

// flagsSet returns the names of the flags the command line set.
func flagsSet(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	return set
}

// errHelp means the command printed its help; run returns nil.
var errHelp = errors.New("help printed")

type stamps struct{ version, commit, modified string } // -ldflags -X's; "" unset

// versionText is what sluice version prints: version, commit and whether
// the tree was modified, each as ldflags stamped it, else go build's (the
// main module's version: v1.2.3 from go install …@v1.2.3, a pseudo-version
// in a clone, (devel) without .git; the vcs stamps), else "unknown".
func versionText(ld stamps, bi *debug.BuildInfo) string {
	var vcsCommit, vcsModified string
	bi = cmp.Or(bi, &debug.BuildInfo{})
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			vcsCommit = s.Value
		case "vcs.modified":
			vcsModified = s.Value
		}
	}
	return fmt.Sprintf("sluice %s\ncommit: %s\nmodified: %s\n", cmp.Or(ld.version, bi.Main.Version, "unknown"),
		cmp.Or(ld.commit, vcsCommit, "unknown"), cmp.Or(ld.modified, vcsModified, "unknown"))
}
