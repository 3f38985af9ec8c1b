// Command informerctl talks to the informerd daemon of its node, with
// kubectl's habits:
//
//	informerctl informers [-w]                       informers, holders, lag and event rate
//	informerctl get RESOURCE [NAME...] [-o FORMAT]   objects from the daemon's informers
//	informerctl watch RESOURCE [-o FORMAT]           their changes, until stopped
//	informerctl address IP:PORT [-w]                 who is behind an address
//	informerctl status -f DIR|FILE|-                 the live kstatus of manifests' objects
//	informerctl proxy [-port 8001|-unix-socket PATH] the API server's API, reads from the daemon, as kubectl proxy
//	informerctl version                              informerctl's and the daemon's versions
//	informerctl completion bash|zsh|fish             a shell completion script
//
// Connection flags (-address, -token-file, -ca-file, -server-name) go
// before or after the command. Every call carries the token in -token-file
// (default /var/run/secrets/informerd/token), a projected ServiceAccount
// token with informerd's audience; the daemon reviews it and authorizes
// each request as that ServiceAccount. docs/informerctl.md describes
// each command's output.
//
// Exit codes: 0 success, 1 an error (from the daemon or the connection),
// 2 a usage error (unknown command or flag, missing argument).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"google.golang.org/grpc"

	"github.com/informerd/informerd/client"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// command is one informerctl command.
type command struct {
	name, args, summary string
	// flags registers the command's own flags (the connection flags are
	// added to every command's set).
	flags func(fs *flag.FlagSet) any
	// run runs the command with its parsed flags (what flags returned) and
	// positional arguments.
	run func(ctx context.Context, e *env, opts any, args []string) error
}

// newCommand makes a command whose flags fill a T.
func newCommand[T any](name, args, summary string, flags func(*flag.FlagSet, *T), run func(context.Context, *env, *T, []string) error) *command {
	return &command{
		name: name, args: args, summary: summary,
		flags: func(fs *flag.FlagSet) any { o := new(T); flags(fs, o); return o },
		run:   func(ctx context.Context, e *env, o any, args []string) error { return run(ctx, e, o.(*T), args) },
	}
}

// commands in the order usage lists them; init fills it, as completion
// refers to it.
var commands []*command

func init() {
	commands = []*command{informersCommand, getCommand, watchCommand, addressCommand, statusCommand, proxyCommand, versionCommand, completionCommand}
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// env is what commands share: where they print and how they reach the
// daemon.
type env struct {
	stdout, stderr io.Writer
	// terminal: stdout is a terminal (tables are redrawn in place);
	// width, if set, returns its width now (0: unknown).
	terminal bool
	width    func() int
	conn     connFlags
}

// connFlags say how to reach the daemon.
type connFlags struct {
	address, tokenFile, caFile, serverName string
	tokenSet                               bool // -token-file was given
}

// defaultConn are the connection flags' defaults.
var defaultConn = connFlags{address: client.DefaultSocket, serverName: "informerd"}

// register adds the connection flags to fs, with c's values as defaults.
func (c *connFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.address, "address", c.address, "daemon address: a Unix socket path, or host:port (TLS unless loopback)")
	fs.Func("token-file", "`FILE` with the caller's ServiceAccount token for informerd's audience, read again when it changes (default "+client.DefaultTokenFile+")", func(s string) error {
		c.tokenFile, c.tokenSet = s, true
		return nil
	})
	fs.StringVar(&c.caFile, "ca-file", c.caFile, "PEM CA bundle to verify the daemon's TLS certificate with; empty: no TLS (Unix socket or loopback only)")
	fs.StringVar(&c.serverName, "server-name", c.serverName, "name the daemon's TLS certificate is checked for, with -ca-file")
}

// dial connects to the daemon (lazily: errors come with the first call).
func (e *env) dial() (*client.Client, error) {
	var opts []grpc.DialOption
	if e.conn.tokenSet { // Dial reads the default token file, if it exists, by itself
		opts = append(opts, client.WithTokenFile(e.conn.tokenFile))
	}
	if e.conn.caFile != "" {
		opts = append(opts, client.WithTLS(e.conn.caFile, e.conn.serverName))
	}
	return client.Dial(e.conn.address, opts...)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], &env{stdout: os.Stdout, stderr: os.Stderr, terminal: isTerminal(os.Stdout), width: terminalWidth(os.Stdout), conn: defaultConn})
	stop()
	os.Exit(code)
}

// usageError is a mistake in the command line: exit code 2.
type usageError struct {
	err error
	cmd string // the command whose usage helps; "" for informerctl's
}

func (u usageError) Error() string { return u.err.Error() }

func usagef(cmd, format string, args ...any) error {
	return usageError{err: fmt.Errorf(format, args...), cmd: cmd}
}

// run runs the command line args and returns the exit code.
func run(ctx context.Context, args []string, e *env) int {
	err := dispatch(ctx, args, e)
	var u usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK // usage was printed
	case errors.As(err, &u):
		fmt.Fprintf(e.stderr, "error: %v\n", u.err)
		if u.cmd != "" {
			fmt.Fprintf(e.stderr, "See 'informerctl %s -h' for usage.\n", u.cmd)
		} else {
			fmt.Fprintln(e.stderr, "See 'informerctl -h' for usage.")
		}
		return exitUsage
	default:
		fmt.Fprintln(e.stderr, describeError(err, e.conn.address))
		return exitError
	}
}

func dispatch(ctx context.Context, args []string, e *env) error {
	fs := flag.NewFlagSet("informerctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	e.conn.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(e.stdout, fs)
			return err
		}
		return usageError{err: err}
	}
	if fs.NArg() == 0 {
		printUsage(e.stderr, fs)
		return usagef("", "missing command: one of %s", commandNames())
	}
	c := lookup(fs.Arg(0))
	if c == nil {
		return usagef("", "unknown command %q: want one of %s", fs.Arg(0), commandNames())
	}
	cfs := flag.NewFlagSet("informerctl "+c.name, flag.ContinueOnError)
	cfs.SetOutput(io.Discard)
	opts := c.flags(cfs)
	e.conn.register(cfs) // the connection flags after the command too, with what was parsed so far as defaults
	pos, err := parseInterspersed(cfs, fs.Args()[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(e.stdout, "%s\n\nUsage: informerctl %s %s [flags]\n\nFlags:\n", c.summary, c.name, c.args)
			cfs.SetOutput(e.stdout)
			cfs.PrintDefaults()
			return err
		}
		return usageError{err: err, cmd: c.name}
	}
	return c.run(ctx, e, opts, pos)
}

// parseInterspersed parses flags before, between and after the positional
// arguments, as kubectl does ("--" ends the flags), and returns the
// positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

func commandNames() string {
	var names []string
	for _, c := range commands {
		names = append(names, c.name)
	}
	return strings.Join(names, ", ")
}

func printUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, "informerctl talks to the informerd daemon of this node.\n\nCommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-11s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nUsage: informerctl [connection flags] COMMAND [ARGS] [flags]; informerctl COMMAND -h for a command's flags.\n\nConnection flags:")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}
