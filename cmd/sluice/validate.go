package main

import (
	"fmt"

	"github.com/sluicehq/sluice/internal/server"
)

func (a *app) validate(args []string) error {
	fs := newFlagSet("validate")
	var path string
	var strict bool
	fs.StringVar(&path, "config", "", "the config `FILE` to check (required)")
	fs.StringVar(&path, "c", "", "shorthand for --config")
	fs.BoolVar(&strict, "strict", false, "refuse what loads but never acts (an Envoy rule or RLQS matcher that can never match, a replaces naming no rule): otherwise a warning")
	if err := a.parseFlags(fs, validateSynopsis, args); err != nil {
		return err // errHelp after -h: run answers nil
	}
	if path == "" {
		return &usageError{msg: "validate needs --config FILE", usage: "Usage: " + validateSynopsis + "\n"}
	}
	// Everything serve would refuse; what it would load but never act on
	// is a warning (envoyproxy/ratelimit loads it too), unless --strict.
	warnings, err := server.Validate(path, a.getenv, strict)
	if err != nil {
		return err
	}
	for _, w := range warnings {
		fmt.Fprintln(a.stdout, "warning:", w)
	}
	fmt.Fprintln(a.stdout, "ok")
	return nil
}
