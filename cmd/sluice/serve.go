package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/sluicehq/sluice/internal/server"
)

// serve parses its flags, builds the logger and runs the server
// (server.Run), which does the rest.
func (a *app) serve(ctx context.Context, args []string) error {
	fs := newFlagSet("serve")
	var path, level, format string
	fs.StringVar(&path, "config", "", "read the config from `FILE` (default: the built-in example)")
	fs.StringVar(&path, "c", "", "shorthand for --config")
	fs.StringVar(&level, "log-level", "info", "log at `LEVEL`: debug (every decision), info, warn or error")
	fs.StringVar(&format, "log-format", "text", "write log records as `FORMAT`: text (key=value) or json")
	if err := a.parseFlags(fs, serveSynopsis, args); err != nil {
		return err // errHelp after -h: run answers nil
	}
	log, err := newLogger(a.stderr, level, format)
	if err != nil {
		return err
	}
	return server.Run(ctx, server.RunOptions{ConfigPath: path, Getenv: a.getenv, Log: log, Clock: a.clock})
}

// newLogger returns serve's logger: format "text" (logfmt) or "json", at
// level.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, &usageError{msg: fmt.Sprintf("--log-level %q: must be debug, info, warn or error", level), usage: "Usage: " + serveSynopsis + "\n"}
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, &usageError{msg: fmt.Sprintf("--log-format %q: must be text or json", format), usage: "Usage: " + serveSynopsis + "\n"}
}
