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
	if cfg == nil {
		return err // unreadable, or not decodable: nothing more to check
	}
	// What serve would refuse after parsing, reported even when the file
	// breaks rules too: secrets missing from the environment, a Redis URL
	// the client rejects, TLS files that do not load.
	var all errorList
	for _, e := range []error{err, preflight(cfg, a.getenv, path)} {
		var list errorList
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
	case 1:
		return all[0]
	default:
		return all
	}
	if err := unsupported(cfg); err != nil {
		fmt.Fprintf(a.stderr, "sluice: warning: %v\n", err)
	}
	fmt.Fprintln(a.stdout, "ok")
	return nil
}
