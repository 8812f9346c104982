package main

// Which PostgreSQL the demo runs on (--postgres): the server DATABASE_URL
// names, the one at the default address, or a private cluster of the run's
// own, started from the machine's server binaries and removed at the end.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/internal/pgcluster"
	"github.com/pgoutbox/outbox/internal/redact"
	"github.com/pgoutbox/outbox/outboxcdc"
)

// The values of demo's --postgres.
const (
	// postgresAuto: DATABASE_URL (or --database-url) when set; otherwise
	// the server at the default address when it answers (--mode polling);
	// otherwise a private cluster.
	postgresAuto = "auto"
	// postgresURL: the server DATABASE_URL, --database-url or the default
	// address names, never a private cluster.
	postgresURL = "url"
	// postgresPrivate: a private cluster, whatever DATABASE_URL says.
	postgresPrivate = "private"
)

// demoDefaultURLEnv, for tests only, replaces the default address the demo
// tries when neither --database-url nor DATABASE_URL is set, so that a
// test can point it at a port where nothing listens.
const demoDefaultURLEnv = "OUTBOX_TEST_DEMO_DEFAULT_DATABASE_URL"

// demoConnectTimeout bounds the wait for the server the demo was told to
// use: one that does not answer fails the run within it.
const demoConnectTimeout = 5 * time.Second

// demoProbeTimeout bounds the look for a server at the default address.
const demoProbeTimeout = 2 * time.Second

// demoPostgres is the PostgreSQL of a run.
type demoPostgres struct {
	url     string
	cluster *pgcluster.Cluster // a private cluster of the run's own, or nil
}

// urlSource says where the database URL came from: "--database-url",
// "DATABASE_URL", or "" when neither is set (the default address).
func urlSource(setFlags map[string]bool) string {
	switch {
	case setFlags["database-url"]:
		return "--database-url"
	case cli.Env("DATABASE_URL", "") != "":
		return "DATABASE_URL"
	}
	return ""
}

// defaultDatabaseURL is the default address: cli.DatabaseURLDefault, or
// the tests' replacement.
func defaultDatabaseURL() string { return cli.Env(demoDefaultURLEnv, cli.DatabaseURLDefault) }

// openPostgres chooses the run's PostgreSQL as --postgres says and checks
// that it answers, or starts a private cluster; the caller closes it.
func (d *demoRun) openPostgres(ctx context.Context) (*demoPostgres, error) {
	f := d.flags
	cdc := f.mode == modeCDC
	source := f.urlSource
	switch f.postgres {
	case postgresPrivate:
		return d.startPrivate("--postgres private")
	case postgresAuto:
		if source != "" {
			break
		}
		if cdc {
			return d.startPrivate("--mode cdc; DATABASE_URL is not set")
		}
		if why := unusable(ctx, f.databaseURL); why != "" {
			return d.startPrivate(why + " and DATABASE_URL is not set")
		}
	}
	if source == "" {
		source = "the default address"
	}
	if err := checkPostgres(ctx, f.databaseURL, source, cdc); err != nil {
		return nil, err
	}
	return &demoPostgres{url: f.databaseURL}, nil
}

// startPrivate starts a private cluster (with wal_level=logical for --mode
// cdc) and says so in one line, with why and where its data is.
func (d *demoRun) startPrivate(why string) (*demoPostgres, error) {
	var settings map[string]string
	kind := "private PostgreSQL cluster"
	if d.flags.mode == modeCDC {
		settings = map[string]string{"wal_level": "logical", "max_replication_slots": "4", "max_wal_senders": "4"}
		kind += " with wal_level=logical"
	}
	if err := pgcluster.Available(); err != nil {
		return nil, fmt.Errorf("cannot start a %s (%s): %w", kind, why, err)
	}
	cluster, err := pgcluster.Start(pgcluster.Config{Settings: settings})
	if err != nil {
		return nil, fmt.Errorf("cannot start a %s (%s): %w", kind, why, err)
	}
	if err := checkVersion(context.Background(), cluster.URL(""), "the private cluster"); err != nil {
		_ = cluster.Close()
		bin, _ := pgcluster.BinDir()
		return nil, fmt.Errorf("%w; install a newer PostgreSQL, or set PG_BINDIR to the directory of its initdb (these are in %s)", err, bin)
	}
	bin, _ := pgcluster.BinDir()
	d.printf("  %s on 127.0.0.1:%d, data directory %s (server binaries in %s): %s; removed at the end unless --keep\n",
		kind, cluster.Port(), cluster.DataDir(), bin, why)
	return &demoPostgres{url: cluster.URL(""), cluster: cluster}, nil
}

// close removes a private cluster, or with --keep stops it and says where
// it is and how to start it again.
func (p *demoPostgres) close(d *demoRun) error {
	if p.cluster == nil {
		return nil
	}
	if !d.flags.keep {
		return p.cluster.Close()
	}
	restart, err := p.cluster.Keep()
	if err != nil {
		return fmt.Errorf("keep the private cluster: %w", err)
	}
	d.printf("kept the private cluster (stopped) in %s; start it again with:\n  %s\n  and connect with DATABASE_URL=%s\n",
		p.cluster.Dir(), restart, p.cluster.URL(""))
	return nil
}

// minServerVersion is the oldest PostgreSQL major version the outbox runs
// on (docs/operations.md).
const minServerVersion = 13

// unusable says why the demo cannot use the server at url, the default
// address (then a private cluster is started instead): nothing answers
// there, what answers is not PostgreSQL, or it wants a password, refuses
// the demo, or is older than minServerVersion; "" when it can use it.
func unusable(ctx context.Context, url string) string {
	name := redact.Database(url)
	if !answers(ctx, url) {
		return "nothing answers at " + name
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "the default address " + name + " does not parse"
	}
	cctx, cancel := context.WithTimeout(ctx, demoConnectTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		msg := redact.Secrets(oneLine(err.Error()), redact.DatabaseSecrets(url)...)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && (pgErr.Code == "28P01" || strings.Contains(pgErr.Message, "password")):
			return "the server at " + name + " wants a password (" + pgErr.Message + ")"
		case errors.As(err, &pgErr):
			return "the server at " + name + " refuses the demo (" + pgErr.Message + ")"
		case strings.Contains(msg, "password"):
			return "the server at " + name + " wants a password (" + msg + ")"
		}
		return "what answers at " + name + " is not PostgreSQL (" + msg + ")"
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if major, version := serverVersion(conn); major < minServerVersion {
		return fmt.Sprintf("the server at %s is PostgreSQL %s, older than %d", name, version, minServerVersion)
	}
	return ""
}

// serverVersion is the server's major version and the version it reports
// (server_version: "16.2 (Debian 16.2-1)", "17beta1"); 0 when unreadable.
func serverVersion(conn *pgx.Conn) (int, string) {
	v := conn.PgConn().ParameterStatus("server_version")
	digits := v
	if i := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		digits = v[:i]
	}
	major, _ := strconv.Atoi(digits)
	return major, v
}

// checkVersion connects to url and fails when the server is older than
// minServerVersion, naming it as what.
func checkVersion(ctx context.Context, url, what string) error {
	cctx, cancel := context.WithTimeout(ctx, demoConnectTimeout)
	defer cancel()
	conn, err := pgx.Connect(cctx, url)
	if err != nil {
		return redact.Error(fmt.Errorf("%s: %w", what, err), redact.DatabaseSecrets(url)...)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return versionError(conn, what)
}

func versionError(conn *pgx.Conn, what string) error {
	if major, version := serverVersion(conn); major < minServerVersion {
		return fmt.Errorf("%s is PostgreSQL %s: the outbox needs PostgreSQL %d or newer", what, version, minServerVersion)
	}
	return nil
}

// answers reports whether anything accepts a connection at url's address.
func answers(ctx context.Context, url string) bool {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return true // not ours to guess: the connection reports it
	}
	network, addr := "tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if strings.HasPrefix(cfg.Host, "/") {
		network, addr = "unix", filepath.Join(cfg.Host, fmt.Sprintf(".s.PGSQL.%d", cfg.Port))
	}
	dialer := net.Dialer{Timeout: demoProbeTimeout}
	conn, err := dialer.DialContext(ctx, network, addr)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// checkPostgres connects to url within demoConnectTimeout, and for --mode
// cdc checks that it decodes its WAL; an error is one line that names the
// URL (its password redacted) and source, and what to do.
func checkPostgres(ctx context.Context, url, source string, cdc bool) error {
	secrets := redact.DatabaseSecrets(url)
	name := redact.Database(url)
	private := "or run with --postgres private for a private cluster of the demo's own"
	elsewhere := "set DATABASE_URL to"
	if source != "the default address" {
		elsewhere = "point " + source + " at"
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return redact.Error(fmt.Errorf("database URL from %s: %w", source, err), secrets...)
	}
	cctx, cancel := context.WithTimeout(ctx, demoConnectTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted: %w", context.Cause(ctx))
		}
		// An error the server sent (a role, a password, a database it
		// refuses) is not one of a server that does not answer.
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) {
			return redact.Error(fmt.Errorf("PostgreSQL at %s (%s) refuses the demo: %s; let it in (pg_hba.conf, the role, the database), %s, %s",
				name, source, oneLine(err.Error()), elsewhere+" a role and database it accepts", private), secrets...)
		}
		return redact.Error(fmt.Errorf("PostgreSQL at %s (%s) does not answer: %s; start it, %s, %s",
			name, source, oneLine(err.Error()), elsewhere+" a server that answers", private), secrets...)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := versionError(conn, fmt.Sprintf("the server at %s (%s)", name, source)); err != nil {
		return fmt.Errorf("%w; upgrade it, %s, %s", err, elsewhere+" a newer server", private)
	}
	if !cdc {
		return nil
	}
	var level string
	if err := conn.QueryRow(cctx, "SHOW wal_level").Scan(&level); err != nil {
		return redact.Error(fmt.Errorf("PostgreSQL at %s (%s): read wal_level: %w", name, source, err), secrets...)
	}
	if level != "logical" {
		return fmt.Errorf("PostgreSQL at %s (%s) has wal_level=%s: --mode cdc needs wal_level=logical there (ALTER SYSTEM SET wal_level = logical, then restart it), or run with --postgres private for a private cluster with it",
			name, source, level)
	}
	return nil
}

// oneLine joins a multi-line message (pgx's, when it tried several
// addresses) into one line.
func oneLine(s string) string {
	lines := strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' })
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	return strings.Join(lines, "; ")
}

// dropCDC removes the replication slot and the publication --mode cdc made
// on a server that is not the run's own (a private cluster goes with its
// directory): a slot left behind would hold the server's WAL forever. The
// slot may still be active for a moment after the stream stopped.
func dropCDC(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	slot := outboxcdc.SlotName(schema, outboxcdc.GroupDefault)
	for {
		_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
		var pgErr *pgconn.PgError
		if err == nil {
			break
		}
		if !errors.As(err, &pgErr) || pgErr.Code != "55006" { // object_in_use: the stream's walsender is still exiting
			return fmt.Errorf("drop replication slot %s: %w", slot, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drop replication slot %s: %w (last error %v)", slot, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	pub := outboxcdc.PublicationName(schema)
	if _, err := pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{pub}.Sanitize()); err != nil {
		return fmt.Errorf("drop publication %s: %w", pub, err)
	}
	return nil
}
