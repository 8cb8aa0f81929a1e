package main

import (
	"errors"
	"fmt"
)

func (a *app) validate(args []string) error {
	fs := newFlagSet("validate")
	var path string
	fs.StringVar(&path, "config", "", "the config `FILE` to check (required)")
	fs.StringVar(&path, "c", "", "shorthand for --config")
	if err := a.parseFlags(fs, validateSynopsis, args); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	if path == "" {
		return &usageError{msg: "validate needs --config FILE", usage: usage}
	}
	cfg, err := loadConfig(path)
	if err != nil {
		return err
	}
	if err := unsupported(cfg); err != nil {
		fmt.Fprintf(a.stderr, "sluice: warning: %v\n", err)
	}
	// What serve would refuse after parsing: secrets missing from the
	// environment, a Redis URL the client rejects, TLS files that do not
	// load.
	if err := preflight(cfg, a.getenv, path); err != nil {
		return err
	}
	fmt.Fprintln(a.stdout, "ok")
	return nil
}
