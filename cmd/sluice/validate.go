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
	if err := a.parseFlags(fs, "sluice validate --config FILE", args); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	if path == "" {
		return &usageError{msg: "validate needs --config FILE", usage: usage}
	}
	// The config and, with an envoy section, its rules files.
	if _, err := load(path); err != nil {
		return err
	}
	fmt.Fprintln(a.stdout, "ok")
	return nil
}
