package main

import (
	"fmt"

	"github.com/sluicehq/sluice/internal/server"
)

func (a *app) validate(args []string) error {
	fs := newFlagSet("validate")
	var path string
	fs.StringVar(&path, "config", "", "the config `FILE` to check (required)")
	fs.StringVar(&path, "c", "", "shorthand for --config")
	if err := a.parseFlags(fs, validateSynopsis, args); err != nil {
		return err // errHelp after -h: run answers nil
	}
	if path == "" {
		return &usageError{msg: "validate needs --config FILE", usage: "Usage: " + validateSynopsis + "\n"}
	}
	// Everything serve would refuse: the config's rules, what it needs
	// from the environment, and the Envoy rules files it names.
	if err := server.Validate(path, a.getenv); err != nil {
		return err
	}
	fmt.Fprintln(a.stdout, "ok")
	return nil
}
