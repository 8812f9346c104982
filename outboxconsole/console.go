package outboxconsole

import (
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/sideeffect"
)

// Defaults for Config.
const (
	PageSizeDefault   = 50
	RefreshDefault    = 10 * time.Second
	SessionTTLDefault = 12 * time.Hour
)

// TokenMinLength is the shortest token New accepts, in bytes.
const TokenMinLength = 16

// Config configures the console.
type Config struct {
	// Pool is the database. Required.
	Pool *pgxpool.Pool
	// Schema is the schema of the outbox tables, as a plain string: the
	// older field, kept working; prefer Tables. Defaults to "outbox".
	Schema string
	// Tables is the schema holding the outbox tables: the one outbox.Schema value
	// an application gives every component's config. Setting it and Schema
	// to different names is refused (outbox.ErrSchemaConflict). Defaults to
	// Schema, then "outbox".
	Tables outbox.Schema
	// InboxSchema is the schema of the inbox tables, whose consumers the
	// console shows. Defaults to Schema.
	InboxSchema string
	// SideEffectSchema is the schema of the side_effects table (package
	// sideeffect) whose attempts the console shows and resolves. Defaults to
	// InboxSchema. Without that table the side-effect page says so.
	SideEffectSchema string
	// Token, when set, is the secret an operator gives at login to be
	// allowed to act, and to see the pages unless PublicRead (at least
	// TokenMinLength bytes, of at least TokenMinDistinctBytes different
	// bytes). Without it the console is read-only and its pages public.
	// An operator's actions are recorded as "console:token:<name>"
	// (ActorTokenPrefix), with the name typed at login.
	Token string
	// PublicRead serves the pages without a login even though Token is
	// set; actions still need one. Off by default: with a token, every
	// page but the login page needs a session.
	PublicRead bool
	// AllowedHosts are the Host header values the console answers (421
	// for any other, which stops DNS rebinding): "name" allows that host
	// on any port, "name:port" that port only, "*" any host. Empty: the
	// loopback names (localhost, 127.0.0.1, ::1), plus the host of Origin
	// when set. "outbox console" sets them from --listen and
	// --allowed-host.
	AllowedHosts []string
	// ReadOnly hides the actions and refuses every POST, token or not.
	ReadOnly bool
	// AuthProxyHeader, when set, names the header ("X-Forwarded-Email",
	// "X-Forwarded-User") in which an authenticating reverse proxy in front
	// of the console passes the signed-in operator. It replaces the token
	// login (Token must then be empty): a request from a TrustedProxies
	// address carrying the header is that operator, whose actions are
	// recorded as "console:proxy:<value>" (ActorProxyPrefix); without the
	// header it has no operator (pages need one, unless PublicRead). A
	// request from any other address carrying the header is refused
	// (403), and a value that is not a name (two values, a control or
	// invisible character, more than ProxyNameMaxLength bytes) is refused
	// (400).
	AuthProxyHeader string
	// TrustedProxies are the proxies whose AuthProxyHeader is believed:
	// addresses ("10.0.0.7", "::1") and networks ("10.0.0.0/24"), matched
	// against the request's remote address (the TCP peer), never against
	// X-Forwarded-For or Forwarded. Required with AuthProxyHeader.
	TrustedProxies []string
	// Publisher, when set, lets the console replay an aggregate's events
	// (Admin.Replay). Without it, replay is not offered.
	Publisher outbox.Publisher
	// Origin is the console's origin as the browser sees it
	// ("https://outbox.example.com"), when a proxy in front rewrites the
	// Host header: POSTs from it are same-origin, and its host is allowed.
	// Defaults to the scheme and Host of each request.
	Origin string
	// PageSize is the number of rows of each list page. Defaults to
	// PageSizeDefault.
	PageSize int
	// Refresh is how often the pages reload themselves (paused while a form
	// is being filled in); negative turns it off. Defaults to
	// RefreshDefault.
	Refresh time.Duration
	// SessionTTL is how long a login lasts. Defaults to SessionTTLDefault.
	SessionTTL time.Duration
	// ReplayTimeout bounds a replay started from the console. Defaults to
	// one minute.
	ReplayTimeout time.Duration
	// Logger receives one line per action and per failed request. Defaults
	// to slog.Default().
	Logger *slog.Logger
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

type console struct {
	*gate
	cfg   Config
	admin *outbox.Admin
	inbox *inbox.Admin
	se    *sideeffect.Admin
	pages map[string]*template.Template
	// base is the path the console's pages are under: empty for New's,
	// "/sources/<database>/<schema>" for a source of NewMulti's.
	base string
	// database names the source's database on its pages, and handler
	// serves them under base (NewMulti); index is set on the console that
	// renders NewMulti's index and login page.
	database string
	handler  http.Handler
	index    bool
}

// isSinglePage reports whether a GET of path is one of New's pages.
func isSinglePage(path string) bool {
	return path == "/" || path == "/quarantine" || path == "/inbox" || path == "/operations" ||
		path == "/events" || strings.HasPrefix(path, "/events/") || path == "/quarantine/bulk" ||
		path == "/sideeffects"
}

// New returns the console's handler. It does not touch the database until
// a page is requested.
func New(cfg Config) (http.Handler, error) {
	if cfg.Pool == nil {
		return nil, errors.New("outboxconsole: Config.Pool is required")
	}
	g, err := newGate(cfg.Token, cfg.PublicRead, cfg.ReadOnly, cfg.Origin, cfg.SessionTTL, cfg.Logger,
		cfg.AllowedHosts, cfg.AuthProxyHeader, cfg.TrustedProxies)
	if err != nil {
		return nil, err
	}
	c, err := newConsole(g, cfg, "")
	if err != nil {
		return nil, err
	}
	g.home, g.isPage, g.render = "/quarantine", isSinglePage, c.render
	mux := c.routes()
	mux.HandleFunc("GET /login", g.loginPage)
	mux.HandleFunc("POST /login", g.login)
	mux.HandleFunc("POST /logout", g.logout)
	return g.guard(mux), nil
}

// newConsole is the pages of one schema, under base, behind gate g.
func newConsole(g *gate, cfg Config, base string) (*console, error) {
	schema, err := pgident.Pick(string(cfg.Tables), cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("outboxconsole: %w", err)
	}
	cfg.Schema = schema.Name()
	if cfg.InboxSchema == "" {
		cfg.InboxSchema = cfg.Schema
	}
	if cfg.SideEffectSchema == "" {
		cfg.SideEffectSchema = cfg.InboxSchema
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = PageSizeDefault
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = RefreshDefault
	}
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = time.Minute
	}
	cfg.Token, cfg.ReadOnly, cfg.SessionTTL, cfg.Logger = "", g.readOnly, g.sessionTTL, g.log
	admin, err := outbox.NewAdmin(cfg.Pool, outbox.AdminConfig{Schema: cfg.Schema})
	if err != nil {
		return nil, err
	}
	inboxAdmin, err := inbox.NewAdmin(cfg.Pool, inbox.AdminConfig{Schema: cfg.InboxSchema})
	if err != nil {
		return nil, err
	}
	seAdmin, err := sideeffect.NewAdmin(cfg.Pool, sideeffect.AdminConfig{Schema: cfg.SideEffectSchema})
	if err != nil {
		return nil, err
	}
	c := &console{gate: g, cfg: cfg, admin: admin, inbox: inboxAdmin, se: seAdmin, base: base}
	if c.pages, err = parseTemplates(base, pageNames); err != nil {
		return nil, err
	}
	return c, nil
}

// routes are the console's pages, static files and actions, relative to
// its base.
func (c *console) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /static/", staticHandler())
	mux.HandleFunc("GET /{$}", c.overview)
	mux.HandleFunc("GET /quarantine", c.quarantine)
	mux.HandleFunc("GET /inbox", c.inboxPage)
	mux.HandleFunc("GET /operations", c.operations)
	mux.HandleFunc("POST /quarantine/retry", c.retry)
	mux.HandleFunc("POST /quarantine/skip", c.skip)
	mux.HandleFunc("POST /replay", c.replay)
	mux.HandleFunc("GET /events", c.events)
	mux.HandleFunc("GET /events/{id}", c.event)
	mux.HandleFunc("GET /events/{id}/payload", c.payload)
	mux.HandleFunc("GET /quarantine/bulk", c.bulkPreview)
	mux.HandleFunc("POST /quarantine/bulk", c.bulkApply)
	mux.HandleFunc("POST /inbox/resolve", c.inboxResolve)
	mux.HandleFunc("GET /sideeffects", c.sideEffects)
	mux.HandleFunc("POST /sideeffects/resolve", c.sideEffectResolve)
	return mux
}

// staticHandler serves the embedded stylesheet and script.
func staticHandler() http.Handler {
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err) // the directory is embedded
	}
	return http.StripPrefix("/static/", noListing(http.FileServerFS(static)))
}

// noListing answers 404 for a directory (a path ending in "/"), which a
// file server would list.
func noListing(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "" || strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}
