package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/internal/destination"
	"github.com/pgoutbox/outbox/outboxconsole"
)

// consoleListenDefault is where the console listens unless told otherwise:
// the loopback interface only.
const consoleListenDefault = "127.0.0.1:8089"

const consoleUsage = `console [--listen ADDR] [--read-only] [--destination URL] [--auth-proxy-header H --trusted-proxy ADDR] [flags]
       console --config relay.yaml [--listen ADDR] [--read-only] [flags]

Serves the operator console, a web application: backlog, oldest pending age (and oldest
blocked behind a quarantined event), events published, failed publish attempts, backlog and
commit→ack latency per minute over the last hour, relays and destinations with their
heartbeats and readiness, leases, aggregates blocked behind quarantined events, the
quarantine (retry, skip with a reason), replay of one aggregate, inbox consumers with
aggregates waiting on a gap (resolve), side-effect attempts parked, unknown or in flight
(resolve as succeeded or failed, or call again), and the audit log. Every list is paginated. Everything is embedded in the binary; it works offline.

The token is in env OUTBOX_CONSOLE_TOKEN (or in the file --token-file names), at least 16
bytes of at least 8 different values, never a flag: an operator logs in with it and a name,
and every action is recorded in outbox_operations as console:token:<name>. With a token every page
needs that login, unless --public-read (actions always do); failed logins are throttled and
logging out ends the session on the server. Behind a reverse proxy that signs operators in
(oauth2-proxy, SSO at the ingress), --auth-proxy-header X-Forwarded-Email replaces the token
login: a request from a --trusted-proxy address (the TCP peer, never X-Forwarded-For) carrying
that header is that operator, recorded as console:proxy:<value>; the same header from any other
address is refused (403), and a value with a control or invisible character or over 256 bytes
too (400). Without a token or a proxy the console is read-only, and then it serves only a
loopback address unless both --read-only and --public-read are given.
It answers only requests whose Host is one it serves (421 otherwise, against DNS
rebinding): the --listen address (every local address and the machine's name when it listens
on all of them; localhost too on a loopback one), the host of --origin, and each
--allowed-host. It listens on 127.0.0.1 by default; put it behind a TLS proxy to expose it
(and set --origin to the address the browser uses). Replay of one aggregate is offered only
with --destination (env OUTBOX_DESTINATION) reachable at start. SIGINT or SIGTERM shuts it
down gracefully.

Many outboxes (--config relay.yaml, the file of 'outbox relay --config'): an index at / lists
every source, database/schema (a pattern's schemas as they are at each load), with its backlog,
oldest pending age, quarantined events and relays alive, or "down" with the error; each
source's console is under /sources/DATABASE/SCHEMA/, behind one login for all. One pool per
database, of --fleet-max-conns connections (the console's own cap, not the file's max_conns);
the index reads that many sources of a database at once, each within its own timeout. A schema
or outbox table owned by a role not in the database's trusted_owners (default: the role the
URL connects as), or an outbox table that is a view, is shown down, never read. --database-url, --schema, --inbox-schema, --sideeffect-schema and
--destination are refused beside it (no replay).`

// Bounds of the console server's connections: reading a request (headers
// and form), and keeping an idle connection.
const (
	consoleReadHeaderTimeout = 10 * time.Second
	consoleReadTimeout       = 30 * time.Second
	consoleIdleTimeout       = time.Minute
)

func runConsole(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "console", consoleUsage)
	var common cli.Common
	var dest destination.Options
	common.Register(fs)
	dest.Register(fs)
	listen := fs.String("listen", cli.Env("OUTBOX_CONSOLE_LISTEN", consoleListenDefault), "`ADDR` to serve on, host:port (env OUTBOX_CONSOLE_LISTEN)")
	readOnly := fs.Bool("read-only", envBool("OUTBOX_CONSOLE_READ_ONLY"), "show, never act: no actions offered, every POST refused (env OUTBOX_CONSOLE_READ_ONLY)")
	tokenFile := fs.String("token-file", cli.Env("OUTBOX_CONSOLE_TOKEN_FILE", ""), "read the token from this `FILE` instead of env OUTBOX_CONSOLE_TOKEN (env OUTBOX_CONSOLE_TOKEN_FILE)")
	origin := fs.String("origin", cli.Env("OUTBOX_CONSOLE_ORIGIN", ""), "the console's origin as browsers see it, e.g. https://outbox.example.com, when a proxy rewrites Host (env OUTBOX_CONSOLE_ORIGIN; default: each request's own); its host is allowed")
	var allowedHosts hostList
	allowedHosts.Set(cli.Env("OUTBOX_CONSOLE_ALLOWED_HOSTS", "")) //nolint:errcheck // never fails
	fs.Var(&allowedHosts, "allowed-host", "a `HOST` or HOST:PORT the console answers for besides the --listen address (repeat, or separate with commas; * allows any; env OUTBOX_CONSOLE_ALLOWED_HOSTS)")
	publicRead := fs.Bool("public-read", envBool("OUTBOX_CONSOLE_PUBLIC_READ"), "serve the pages to anyone who reaches the console, without a login (actions still need one) (env OUTBOX_CONSOLE_PUBLIC_READ)")
	authProxyHeader := fs.String("auth-proxy-header", cli.Env("OUTBOX_CONSOLE_AUTH_PROXY_HEADER", ""), "take the operator from this request `HEADER` set by an authenticating reverse proxy, e.g. X-Forwarded-Email, instead of the token login; believed only from a --trusted-proxy (env OUTBOX_CONSOLE_AUTH_PROXY_HEADER)")
	var trustedProxies hostList
	trustedProxies.Set(cli.Env("OUTBOX_CONSOLE_TRUSTED_PROXIES", "")) //nolint:errcheck // never fails
	fs.Var(&trustedProxies, "trusted-proxy", "an `ADDR` or network (10.0.0.7, 10.0.0.0/24) of the proxy whose --auth-proxy-header is believed, matched against the connection's peer (repeat, or separate with commas; env OUTBOX_CONSOLE_TRUSTED_PROXIES)")
	inboxSchema := fs.String("inbox-schema", cli.Env("OUTBOX_INBOX_SCHEMA", ""), "schema of the inbox tables whose consumers are shown (env OUTBOX_INBOX_SCHEMA; default: --schema)")
	seSchema := fs.String("sideeffect-schema", cli.Env("OUTBOX_SIDEEFFECT_SCHEMA", ""), "schema of the side-effect attempts shown and resolved (env OUTBOX_SIDEEFFECT_SCHEMA; default: --inbox-schema)")
	refresh := fs.Duration("refresh", outboxconsole.RefreshDefault, "how often pages reload themselves; 0 turns it off")
	pageSize := fs.Int("page-size", outboxconsole.PageSizeDefault, "rows per list page")
	fleetMaxConns := fs.Int("fleet-max-conns", consoleFleetMaxConnsDefault, "with --config: the console's own pool size per database (not the file's max_conns, which sizes the relay's); the index reads at most this many sources of a database at once")
	configFile := fs.String("config", cli.Env("OUTBOX_CONSOLE_CONFIG", ""), "show every source of a fleet's configuration `FILE` (outbox relay --config): an index of every database and schema (a pattern's schemas as they are now) with its backlog, oldest pending age, quarantined events and relays alive, each source's console under /sources/DATABASE/SCHEMA/, one login for all (env OUTBOX_CONSOLE_CONFIG). Not with --database-url, --schema, --inbox-schema, --sideeffect-schema or --destination")
	err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if *configFile != "" {
		if err := checkConsoleFleetFlags(fs); err != nil {
			return err
		}
	}
	switch {
	case *pageSize < 1 || *pageSize > 1000:
		return cli.Usagef(fs, "--page-size %d must be between 1 and 1000", *pageSize)
	case *refresh < 0:
		return cli.Usagef(fs, "--refresh %s is negative", *refresh)
	}
	token, err := consoleToken(*tokenFile)
	if err != nil {
		return err
	}
	proxy := *authProxyHeader != ""
	switch {
	case token != "" && proxy:
		return errors.New("a console token and --auth-proxy-header are exclusive: the proxy's identity replaces the token login (unset OUTBOX_CONSOLE_TOKEN, or drop --auth-proxy-header)")
	case proxy && len(trustedProxies) == 0:
		return cli.Usagef(fs, "--auth-proxy-header needs --trusted-proxy: the addresses of the proxy, the only ones whose header is believed")
	case !proxy && len(trustedProxies) > 0:
		return cli.Usagef(fs, "--trusted-proxy without --auth-proxy-header: name the header the proxy passes the operator in")
	}
	if token != "" {
		if err := outboxconsole.CheckToken(token); err != nil {
			return fmt.Errorf("the console %s", strings.TrimPrefix(err.Error(), "outboxconsole: the "))
		}
	}
	loopback, err := isLoopback(*listen)
	if err != nil {
		return cli.Usagef(fs, "--listen %q: %v", *listen, err)
	}
	switch {
	case token == "" && !proxy && !loopback && !*readOnly:
		return fmt.Errorf("refusing to serve the console on %s without a token: set OUTBOX_CONSOLE_TOKEN (or --auth-proxy-header behind a proxy that signs operators in), pass --read-only --public-read, or listen on 127.0.0.1", *listen)
	case token == "" && !proxy && !loopback && !*publicRead:
		return fmt.Errorf("refusing to serve the console's pages on %s to anyone without a login: set OUTBOX_CONSOLE_TOKEN, or pass --public-read to make them public", *listen)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	r := *refresh
	if r == 0 {
		r = -1
	}
	var (
		h       http.Handler
		ln      net.Listener
		hosts   []string
		pub     outbox.Publisher
		schemas = common.Schema
	)
	if *configFile != "" {
		if *fleetMaxConns < 1 {
			return cli.Usagef(fs, "--fleet-max-conns %d: at least 1", *fleetMaxConns)
		}
		fc, err := openFleetConsole(ctx, *configFile, int32(*fleetMaxConns))
		if err != nil {
			return err
		}
		defer fc.Close()
		logFleetConsole(log, *configFile, fc)
		if ln, err = net.Listen("tcp", *listen); err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		defer ln.Close()
		hosts = append(listenHosts(ln.Addr().(*net.TCPAddr), log), allowedHosts...)
		h, err = outboxconsole.NewMulti(outboxconsole.MultiConfig{Sources: fc.sources, Token: token,
			AuthProxyHeader: *authProxyHeader, TrustedProxies: trustedProxies,
			ReadOnly: *readOnly, PublicRead: *publicRead, AllowedHosts: hosts, Origin: *origin, PageSize: *pageSize, Refresh: r, Logger: log})
		if err != nil {
			return err
		}
		schemas = "every source of " + *configFile
	} else {
		// openAdmin checks that the schema is migrated; the console makes its own.
		_, pool, err := openAdmin(ctx, common, nil)
		if err != nil {
			return err
		}
		defer pool.Close()
		// Replay is the console's only use of the destination: when it cannot
		// be reached, the console serves without replay rather than not at all.
		if dest.URL != "" && !*readOnly && (token != "" || proxy) {
			p, closePub, err := destination.Open(ctx, dest)
			if err != nil {
				log.Warn("replay disabled: the destination cannot be opened", "err", err)
			} else {
				defer closePub()
				pub = p
			}
		}
		if ln, err = net.Listen("tcp", *listen); err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		defer ln.Close()
		hosts = append(listenHosts(ln.Addr().(*net.TCPAddr), log), allowedHosts...)
		h, err = outboxconsole.New(outboxconsole.Config{Pool: pool, Schema: common.Schema, InboxSchema: *inboxSchema, SideEffectSchema: *seSchema, Token: token,
			AuthProxyHeader: *authProxyHeader, TrustedProxies: trustedProxies,
			ReadOnly: *readOnly, PublicRead: *publicRead, AllowedHosts: hosts, Publisher: pub, Origin: *origin, PageSize: *pageSize, Refresh: r, Logger: log})
		if err != nil {
			return err
		}
	}
	mode := "actions need the token"
	switch {
	case *readOnly:
		mode = "read-only"
	case proxy:
		mode = "actions need the proxy's " + http.CanonicalHeaderKey(*authProxyHeader)
	case token == "":
		mode = "read-only: no OUTBOX_CONSOLE_TOKEN"
	}
	pages := "need a login"
	if (token == "" && !proxy) || *publicRead {
		pages = "public: anyone who reaches the console reads them"
	}
	log.Info("outbox console serving", "url", "http://"+ln.Addr().String()+"/", "schema", schemas, "mode", mode, "pages", pages,
		"replay", pub != nil, "allowed_hosts", strings.Join(hosts, ","))
	if !loopback {
		log.Warn("the console listens beyond this machine: serve it behind TLS (a reverse proxy) so the token and session cookie are not sent in clear", "listen", ln.Addr().String())
	}
	srv := newConsoleServer(h, log)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Info("outbox console stopped")
	return nil
}

// consoleToken reads the token from the file, or else from the environment.
func consoleToken(file string) (string, error) {
	if file == "" {
		return os.Getenv("OUTBOX_CONSOLE_TOKEN"), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read the console token: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("the console token file %s is empty", file)
	}
	return t, nil
}

// isLoopback reports whether addr (host:port) listens on the loopback
// interface only. An empty host, 0.0.0.0 or :: listen everywhere; a host
// name counts as loopback when every address it resolves to is.
func isLoopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	if host == "" {
		return false, nil
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback(), nil
	}
	ips, err := net.LookupIP(host)
	if err != nil {
		return false, err
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return false, nil
		}
	}
	return len(ips) > 0, nil
}

// newConsoleServer is the console's HTTP server, with bounds on reading a
// request and on idle connections (a client that trickles its request
// cannot hold a connection open).
func newConsoleServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: consoleReadHeaderTimeout, ReadTimeout: consoleReadTimeout,
		IdleTimeout: consoleIdleTimeout, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
}

// listenHosts are the Host values a console listening on addr answers for:
// the address itself with its port; on a loopback address also localhost;
// on all addresses (0.0.0.0, ::) every address of the machine's interfaces
// and its host name, with the port.
func listenHosts(addr *net.TCPAddr, log *slog.Logger) []string {
	port := strconv.Itoa(addr.Port)
	var hosts []string
	add := func(h string) { hosts = append(hosts, net.JoinHostPort(h, port)) }
	switch {
	case addr.IP.IsUnspecified():
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			log.Warn("the console cannot list this machine's addresses: pass --allowed-host", "err", err)
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				add(ipn.IP.String())
			}
		}
		add("localhost")
		if name, err := os.Hostname(); err == nil && name != "" {
			add(name)
		}
	case addr.IP.IsLoopback():
		for _, h := range []string{"localhost", "127.0.0.1", "::1"} {
			add(h)
		}
	default:
		add(addr.IP.String())
	}
	return hosts
}

// hostList is a flag of hosts, repeated or separated by commas.
type hostList []string

func (l *hostList) String() string { return strings.Join(*l, ",") }

func (l *hostList) Set(v string) error {
	for _, h := range strings.Split(v, ",") {
		if h = strings.TrimSpace(h); h != "" {
			*l = append(*l, h)
		}
	}
	return nil
}

func envBool(key string) bool {
	v, err := strconv.ParseBool(os.Getenv(key))
	return err == nil && v
}
