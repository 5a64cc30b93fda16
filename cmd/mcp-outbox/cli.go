package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
)

// command is one subcommand. run returns an error to print; a usageError
// also prints the command's usage and exits 2.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *environment, args []string) error
}

// environment is what a command may touch: its streams and the process
// environment (injected so tests can run commands in-process).
type environment struct {
	stdin   io.Reader
	stdout  io.Writer
	stderr  io.Writer
	getenv  func(string) string
	environ func() []string
}

func commands() []command {
	return []command{
		{"demo", "reproduce the four duplicate-call scenarios, without and with the layer", runDemo},
		{"serve", "run the example payments ledger as an MCP server (stdio or Streamable HTTP)", runServe},
		{"proxy", "put the outbox in front of an MCP tool server in any language (sidecar)", runProxy},
		{"drain", "deliver every effect that is due, then exit with a summary (for deploy hooks)", runDrain},
		{"status", "show what happened to a call, by key or by tool and arguments", runStatus},
		{"outbox", "list, retry, cancel and resolve the outbox's effects (downstream deliveries)", runOutbox},
		{"purge", "delete expired calls and old delivered or cancelled effects (--dry-run to count)", runPurge},
		{"token", "make a bearer token for serve --http (new PRINCIPAL), or hash one (hash)", runToken},
		{"version", "print the module version, VCS revision and Go toolchain of this build", runVersion},
		{"help", "show help for a command", nil},
	}
}

const overview = `mcp-outbox makes side-effecting MCP tool calls happen once per logical call,
even when clients time out, cancel, restart the server or retry, and answers
"what happened to my call?".

Usage:
  mcp-outbox <command> [flags]

Commands:
%s
Run 'mcp-outbox <command> --help' for a command's flags.
`

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return runEnv(ctx, &environment{stdin: stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv, environ: os.Environ}, args)
}

func runEnv(ctx context.Context, env *environment, args []string) int {
	cmds := commands()
	if len(args) == 0 || isHelpFlag(args[0]) {
		printOverview(env.stdout, cmds)
		return 0
	}
	name := args[0]
	if name == "help" {
		// help has no usage of its own beyond the overview: `help`,
		// `help --help` and `help help` all ask for it.
		if len(args) == 1 || isHelpFlag(args[1]) || args[1] == "help" {
			printOverview(env.stdout, cmds)
			return 0
		}
		name, args = args[1], []string{args[1], "--help"}
	}
	for _, c := range cmds {
		if c.name == name && c.run != nil {
			err := c.run(ctx, env, args[1:])
			switch {
			case err == nil:
				return 0
			case errors.Is(err, flag.ErrHelp):
				return 0
			case errors.As(err, new(usageError)):
				fmt.Fprintf(env.stderr, "mcp-outbox %s: %v\nRun 'mcp-outbox %s --help' for usage.\n", name, err, name)
				return 2
			default:
				var ec exitCode
				if errors.As(err, &ec) {
					return int(ec)
				}
				fmt.Fprintf(env.stderr, "mcp-outbox %s: %v\n", name, err)
				return 1
			}
		}
	}
	fmt.Fprintf(env.stderr, "mcp-outbox: unknown command %q\n\n", name)
	printOverview(env.stderr, cmds)
	return 2
}

func isHelpFlag(s string) bool { return s == "-h" || s == "--help" || s == "-help" }

func printOverview(w io.Writer, cmds []command) {
	var b strings.Builder
	for _, c := range cmds {
		fmt.Fprintf(&b, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, overview, b.String())
}

// usageError is a mistake in the command line.
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// exitCode ends the command with a code and no further message.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// newFlagSet returns a flag set whose --help prints usage to stdout and
// whose errors are usage errors.
func newFlagSet(env *environment, name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(env.stdout, "%s\nFlags:\n", strings.TrimSpace(usage))
		fs.SetOutput(env.stdout)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

// parseFlags parses args; on --help it prints usage and returns flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string) error {
	// The flag package prints the usage on every parse error too. That
	// belongs on stdout only when asked for: serve's stdout is the MCP
	// transport, and a mistake is reported on stderr by runEnv.
	printUsage := fs.Usage
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.Usage = printUsage
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage()
			return flag.ErrHelp
		}
		return usageError{err}
	}
	return nil
}

// envDefault returns the environment's value for name, or def.
func (env *environment) envDefault(name, def string) string {
	if v := env.getenv(name); v != "" {
		return v
	}
	return def
}

func (env *environment) envDuration(name string, def time.Duration) (time.Duration, error) {
	v := env.getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, usagef("%s=%q: %v", name, v, err)
	}
	return d, nil
}

func (env *environment) envInt(name string, def int) (int, error) {
	v := env.getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, usagef("%s=%q: not a whole number", name, v)
	}
	return n, nil
}

// newLogger logs to stderr only: on stdio, stdout is the MCP transport.
// An empty format is text, so configurations built in code need not say.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usagef("log format %q: want text or json", format)
}

// stdio is the MCP transport on the command's own streams, hardened
// against malformed lines by the library; the streams stay open when the
// session ends: they belong to the command.
func (env *environment) stdio(logger *slog.Logger) mcp.Transport {
	return mcpstdio.NewTransport(&mcp.IOTransport{Reader: io.NopCloser(env.stdin), Writer: nopWriteCloser{env.stdout}},
		&mcpstdio.Options{Logger: logger})
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// multiFlag collects a repeated flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }
