package main

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/internal/config"
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
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	if err := unsupported(cfg); err != nil {
		fmt.Fprintf(a.stderr, "sluice: warning: %v\n", err)
	}
	fmt.Fprintln(a.stdout, "ok")
	return nil
}
