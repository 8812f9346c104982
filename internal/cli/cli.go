// Package cli holds what the outbox and orders binaries share: flags with
// environment fallbacks, signal handling and one-line errors.
package cli

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
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/redact"
)

// DatabaseURLDefault is used when neither --database-url nor DATABASE_URL is set.
const DatabaseURLDefault = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Env returns the environment variable key, or def when it is unset or empty.
func Env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Common are the flags every command that talks to the database takes.
type Common struct {
	DatabaseURL string
	Schema      string
	// RuntimeParams are session settings the command wants on its
	// connections, unless the database URL sets them itself.
	RuntimeParams map[string]string
}

// Register adds the common flags to fs.
func (c *Common) Register(fs *flag.FlagSet) {
	DatabaseURLFlag(fs, &c.DatabaseURL)
	fs.StringVar(&c.Schema, "schema", Env("OUTBOX_SCHEMA", "outbox"), "PostgreSQL schema of the outbox tables (env OUTBOX_SCHEMA)")
}

// Connect opens a pool and checks that the database answers.
func (c *Common) Connect(ctx context.Context) (*pgxpool.Pool, error) {
	pool, err := c.NewPool()
	if err != nil {
		return nil, err
	}
	if err := c.Ping(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// Ping checks that the database answers on pool, within 10 seconds.
func (c *Common) Ping(ctx context.Context, pool *pgxpool.Pool) error {
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		cfg := pool.Config().ConnConfig
		return redact.Error(fmt.Errorf("connect to database %s:%d: %w", cfg.Host, cfg.Port, err), redact.DatabaseSecrets(c.DatabaseURL)...)
	}
	return nil
}

// NewPool opens a pool without connecting: its connections are made when
// first used, so it works while the database is still down.
func (c *Common) NewPool() (*pgxpool.Pool, error) {
	if redact.UnencodedAt(c.DatabaseURL) {
		// pgx would cut the password at its first '@' and try the rest as
		// the host name, quoting it in every connection error (the relay's
		// log, /readyz, status --json).
		return nil, errors.New("database url: the user name or password holds an unencoded '@': write it as %40")
	}
	if redact.UnencodedSlash(c.DatabaseURL) {
		// pgx would take the user name for the host, the password's head
		// for the port and its tail for the database name or a parameter,
		// and quote them in its errors (parse and connection alike).
		return nil, errors.New("database url: an '@' after a '/' with no user part before it: a password holding an unencoded '/' (write it as %2F), or an '@' in the database name or a parameter (write it as %40)")
	}
	cfg, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		// pgx shows the URL with its password masked; the rest of the
		// message is checked too.
		return nil, redact.Error(fmt.Errorf("database url: %w", err), redact.DatabaseSecrets(c.DatabaseURL)...)
	}
	// pgxpool pings a connection idle for over a second before handing it
	// out. An idle relay polls once a second, so that would double its
	// queries; ping only connections idle for a minute (a broken connection
	// fails its query, and the relay retries).
	cfg.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool { return p.IdleDuration > time.Minute }
	for k, v := range c.RuntimeParams {
		if _, ok := cfg.ConnConfig.RuntimeParams[k]; !ok {
			cfg.ConnConfig.RuntimeParams[k] = v
		}
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, redact.Error(fmt.Errorf("connect to database: %w", err), redact.DatabaseSecrets(c.DatabaseURL)...)
	}
	return pool, nil
}

// Command is one subcommand of a binary.
type Command struct {
	Name    string
	Summary string
	// Run parses args (after the command name) and runs the command.
	Run func(ctx context.Context, args []string) error
}

// ErrUsage is returned for bad command-line arguments; the message was
// already printed by the flag package.
var ErrUsage = errors.New("usage")

// NewFlagSet returns a flag set that prints usage to stderr and reports
// errors instead of exiting.
func NewFlagSet(binary, name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(binary+" "+name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s %s\n\n", binary, usage)
		hideSecretDefaults(fs)
		fs.PrintDefaults()
	}
	return fs
}

// Parse is ParseWithArgs for commands that take no positional argument:
// one is refused like a bad flag, in one line.
func Parse(fs *flag.FlagSet, args []string) error {
	pos, err := ParseWithArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return Usagef(fs, "unexpected argument %q", pos[0])
	}
	return nil
}

// Main dispatches os.Args to commands, cancels the context on SIGINT or
// SIGTERM, and turns an error into one line on stderr and exit code 1
// (2 for usage errors).
func Main(binary, about string, commands []Command) {
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "%s\n\nUsage: %s <command> [flags]\n\nCommands:\n", about, binary)
		for _, c := range commands {
			fmt.Fprintf(w, "  %-12s %s\n", c.Name, c.Summary)
		}
		fmt.Fprintf(w, "\nRun '%s <command> --help' for a command's flags.\n", binary)
	}
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	name := os.Args[1]
	if name == "-h" || name == "--help" || name == "help" {
		usage(os.Stdout)
		return
	}
	if name == "--version" || name == "-version" {
		// The flag spelling of a "version" command, for binaries that
		// have one ("outbox --version" is "outbox version").
		for _, c := range commands {
			if c.Name == "version" {
				name = c.Name
			}
		}
	}
	for _, c := range commands {
		if c.Name != name {
			continue
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := c.Run(ctx, os.Args[2:])
		stop()
		switch {
		case err == nil:
			return
		case errors.Is(err, ErrUsage):
			os.Exit(2)
		default:
			fmt.Fprintf(os.Stderr, "%s %s: %v\n", binary, name, err)
			os.Exit(1)
		}
	}
	fmt.Fprintf(os.Stderr, "%s: unknown command %q (run '%s --help')\n", binary, name, binary)
	os.Exit(2)
}

// Dispatch runs the subcommand of a command with subcommands (outbox inbox
// status, outbox quarantine list, ...): args[0] names one of subs, the rest
// are its arguments. fs is the parent command's flag set, for its usage.
func Dispatch(ctx context.Context, fs *flag.FlagSet, args []string, subs []Command) error {
	names := make([]string, len(subs))
	for i, s := range subs {
		names[i] = s.Name
	}
	want := strings.Join(names, ", ")
	if len(args) == 0 {
		return Usagef(fs, "missing subcommand: %s", want)
	}
	for _, s := range subs {
		if s.Name == args[0] {
			return s.Run(ctx, args[1:])
		}
	}
	switch {
	case args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help":
		fs.Usage()
		return nil
	case strings.HasPrefix(args[0], "-"):
		return Usagef(fs, "missing subcommand: %s (it comes before the flags)", want)
	}
	return Usagef(fs, "unknown subcommand %q: want one of %s", args[0], want)
}
