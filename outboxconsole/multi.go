package outboxconsole

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtrust"
	"github.com/pgoutbox/outbox/internal/redact"
)

// FiguresTimeoutDefault bounds the reading of one source's figures for the
// index of a console of several outboxes.
const FiguresTimeoutDefault = 5 * time.Second

// IndexTimeoutMin is the least default of MultiConfig.IndexTimeout.
const IndexTimeoutMin = 10 * time.Second

// Source is one outbox of a console of several (NewMulti): a schema of a
// database.
type Source struct {
	// Database names the database (a key of the fleet's file); Schema the
	// schema of the outbox tables. A Database that is not a valid key
	// (pgident.ValidateKey: letters, digits, '_', '.', '-', no "..") is
	// shown down, its pages not served: it could not be one segment of
	// their path. The source's pages are under
	// /sources/<Database>/<Schema>/.
	Database string
	Schema   string
	// Pool is the database's pool, shared by its sources.
	Pool *pgxpool.Pool
	// TrustedOwners are the roles that may own the schema and its outbox
	// tables (see package pgtrust's checks: tables, not views; no trigger
	// of an untrusted role's function); empty means the pool's role
	// (current_user) only. A source that fails the check is shown as down
	// with the object and owner at fault, and none of its pages is served:
	// its tables are never read, so none of its code runs with the
	// console's role. Compared by name, not by role membership.
	TrustedOwners []string
	// Err, when set, is why the source cannot be shown (its database could
	// not be listed, its schema has no outbox tables): the index shows it
	// as down with this text, which must hold no secret, and its pages
	// are not served. A database that could not be listed at all is one
	// Source with an empty Schema.
	Err error
}

// MultiConfig configures a console of several outboxes (NewMulti). Its
// fields but Sources and FiguresTimeout mean what Config's of the same
// names mean, for the whole console: one login, one session, one Host
// check and one throttle for every source.
type MultiConfig struct {
	// Sources lists the sources: called on each load of the index (so that
	// a schema created since, which a pattern matches, appears) and when a
	// request names a source the last list did not hold. Required.
	Sources func(ctx context.Context) []Source
	// FiguresTimeout bounds reading one source's figures for the index: a
	// source slower than that (its database unreachable) shows as down
	// without holding the others up. Defaults to FiguresTimeoutDefault.
	FiguresTimeout time.Duration
	// IndexTimeout bounds the whole index: the figures of sources still
	// waiting for one of their pool's connections then show as "not read
	// in time" (not as down). At most as many sources of a pool are read
	// at once as the pool has connections (its MaxConns), and each
	// source's FiguresTimeout starts once its turn comes. Defaults to
	// twice FiguresTimeout, at least IndexTimeoutMin.
	IndexTimeout time.Duration

	Token           string
	PublicRead      bool
	AllowedHosts    []string
	ReadOnly        bool
	AuthProxyHeader string
	TrustedProxies  []string
	Origin          string
	PageSize        int
	Refresh         time.Duration
	SessionTTL      time.Duration
	Logger          *slog.Logger
}

// SourceFigures is a row of the index: a source's headline figures
// (outbox.Admin.Gauges), or why it is down.
type SourceFigures struct {
	Database, Schema string
	// URL is the source's console; empty for a database that could not be
	// listed.
	URL string
	// Down is set when the figures could not be read (or the source is
	// not trusted); Error says why. Unread is set when its turn for one of
	// its pool's connections did not come within the index's deadline.
	Down   bool
	Unread bool
	Error  string
	outbox.Backlog
	RelaysAlive int
}

// multi is a console of several outboxes.
type multi struct {
	cfg  MultiConfig
	gate *gate
	root *console // renders the index and the login page

	mu      sync.Mutex
	sources map[string]Source   // the last list, by key
	down    map[string]error    // the databases the last list could not list
	pages   map[string]*console // each source's pages, built on first use
}

// NewMulti returns the handler of a console of several outboxes: an index
// at / listing every source (MultiConfig.Sources) with its headline
// figures, and each source's console, as New serves it, under
// /sources/<database>/<schema>/. The console has one login (/login) for
// every source; each source's actions are recorded in its own schema's
// outbox_operations. Mount it at the root of its server. It does not touch
// the databases until a page is requested.
func NewMulti(cfg MultiConfig) (http.Handler, error) {
	if cfg.Sources == nil {
		return nil, errors.New("outboxconsole: MultiConfig.Sources is required")
	}
	if cfg.FiguresTimeout <= 0 {
		cfg.FiguresTimeout = FiguresTimeoutDefault
	}
	if cfg.IndexTimeout <= 0 {
		cfg.IndexTimeout = max(2*cfg.FiguresTimeout, IndexTimeoutMin)
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = PageSizeDefault
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = RefreshDefault
	}
	g, err := newGate(cfg.Token, cfg.PublicRead, cfg.ReadOnly, cfg.Origin, cfg.SessionTTL, cfg.Logger,
		cfg.AllowedHosts, cfg.AuthProxyHeader, cfg.TrustedProxies)
	if err != nil {
		return nil, err
	}
	m := &multi{cfg: cfg, gate: g, sources: map[string]Source{}, down: map[string]error{}, pages: map[string]*console{}}
	m.root = &console{gate: g, cfg: Config{ReadOnly: g.readOnly, Refresh: cfg.Refresh, PageSize: cfg.PageSize}, index: true}
	if m.root.pages, err = parseTemplates("", []string{"index", "login"}); err != nil {
		return nil, err
	}
	g.home, g.render = "/", m.root.render
	g.isPage = func(path string) bool { return path == "/" || strings.HasPrefix(path, "/sources/") }
	mux := http.NewServeMux()
	mux.Handle("GET /static/", staticHandler())
	mux.HandleFunc("GET /{$}", m.index)
	mux.HandleFunc("GET /login", g.loginPage)
	mux.HandleFunc("POST /login", g.login)
	mux.HandleFunc("POST /logout", g.logout)
	mux.HandleFunc("/sources/{database}/{schema}/", m.source)
	mux.HandleFunc("GET /sources/{database}/{schema}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, sourceBase(r.PathValue("database"), r.PathValue("schema"))+"/", http.StatusSeeOther)
	})
	return g.guard(mux), nil
}

// sourceBase is the path a source's pages are under.
func sourceBase(database, schema string) string {
	return "/sources/" + url.PathEscape(database) + "/" + url.PathEscape(schema)
}

func sourceKey(database, schema string) string { return database + "\x00" + schema }

// list calls MultiConfig.Sources and remembers the list.
func (m *multi) list(ctx context.Context) []Source {
	got := m.cfg.Sources(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sources = make(map[string]Source, len(got))
	m.down = map[string]error{}
	for i, s := range got {
		if s.Err == nil {
			if err := pgident.ValidateKey(s.Database); err != nil {
				// Not one path segment as it is ("eu/west", ".."): no page
				// could be reached at its link.
				s.Err = fmt.Errorf("database: %w", err)
				got[i] = s
			}
		}
		if s.Schema != "" {
			m.sources[sourceKey(s.Database, s.Schema)] = s
		} else if s.Err != nil {
			m.down[s.Database] = s.Err
		}
	}
	return got
}

// index lists every source with its figures: the sources of one pool read
// at most MaxConns at once, each within FiguresTimeout from its turn, the
// whole within IndexTimeout. Each source's owners are checked
// (pgtrust.Check, within its own FiguresTimeout) before its tables are
// read.
func (m *multi) index(w http.ResponseWriter, r *http.Request) {
	sources := m.list(r.Context())
	rows := make([]SourceFigures, len(sources))
	ictx, icancel := context.WithTimeout(r.Context(), m.cfg.IndexTimeout)
	defer icancel()
	turns := map[*pgxpool.Pool]chan struct{}{}
	var wg sync.WaitGroup
	for i, s := range sources {
		rows[i] = SourceFigures{Database: s.Database, Schema: s.Schema}
		if s.Schema != "" && s.Err == nil {
			rows[i].URL = sourceBase(s.Database, s.Schema) + "/"
		}
		if s.Err != nil {
			rows[i].Down, rows[i].Error = true, safeText(oneLine(redact.Text(s.Err.Error())))
			continue
		}
		turn := turns[s.Pool]
		if turn == nil {
			turn = make(chan struct{}, max(int(s.Pool.Config().MaxConns), 1))
			turns[s.Pool] = turn
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case turn <- struct{}{}:
				defer func() { <-turn }()
				if ictx.Err() != nil {
					rows[i].Unread, rows[i].Error = true, "not read within "+m.cfg.IndexTimeout.String()
					return
				}
			case <-ictx.Done():
				rows[i].Unread, rows[i].Error = true, "its turn for one of the database's "+strconv.Itoa(cap(turn))+" connections did not come within "+m.cfg.IndexTimeout.String()
				return
			}
			// The owners' check, then the figures, each within
			// FiguresTimeout: the check's first run on a connection
			// fills its catalogue cache.
			cctx, ccancel := context.WithTimeout(r.Context(), m.cfg.FiguresTimeout)
			err := pgtrust.Check(cctx, s.Pool, s.Schema, s.TrustedOwners)
			ccancel()
			ctx, cancel := context.WithTimeout(r.Context(), m.cfg.FiguresTimeout)
			defer cancel()
			var g outbox.Gauges
			if err == nil {
				var admin *outbox.Admin
				if admin, err = outbox.NewAdmin(s.Pool, outbox.AdminConfig{Schema: s.Schema}); err == nil {
					g, err = admin.Gauges(ctx)
				}
			}
			if err != nil {
				rows[i].Down, rows[i].Error = true, safeText(oneLine(redact.Text(err.Error())))
				return
			}
			rows[i].Backlog, rows[i].RelaysAlive = g.Backlog, g.RelaysAlive
		}()
	}
	wg.Wait()
	m.root.render(w, r, http.StatusOK, "index", pageData{Title: "sources", Sources: rows})
}

// source serves a source's pages under its base, built on first use.
func (m *multi) source(w http.ResponseWriter, r *http.Request) {
	database, schema := r.PathValue("database"), r.PathValue("schema")
	key := sourceKey(database, schema)
	m.mu.Lock()
	s, ok := m.sources[key]
	m.mu.Unlock()
	if !ok {
		m.list(r.Context())
		m.mu.Lock()
		s, ok = m.sources[key]
		m.mu.Unlock()
	}
	if !ok {
		m.mu.Lock()
		err := m.down[database]
		m.mu.Unlock()
		if err != nil {
			http.Error(w, "database "+safeText(database)+" down: "+safeText(oneLine(redact.Text(err.Error()))), http.StatusServiceUnavailable)
			return
		}
		http.Error(w, "no such source: the console's file names no schema "+safeText(schema)+" in database "+safeText(database), http.StatusNotFound)
		return
	}
	if s.Err != nil {
		http.Error(w, "source down: "+safeText(oneLine(redact.Text(s.Err.Error()))), http.StatusServiceUnavailable)
		return
	}
	// Each request: an owner changed since is refused before any of the
	// schema's tables is read (a page) or written (an action).
	if err := pgtrust.Check(r.Context(), s.Pool, schema, s.TrustedOwners); err != nil {
		http.Error(w, "source down: "+safeText(oneLine(redact.Text(err.Error()))), http.StatusServiceUnavailable)
		return
	}
	m.mu.Lock()
	c := m.pages[key]
	if c == nil || c.cfg.Pool != s.Pool {
		base := sourceBase(database, schema)
		var err error
		c, err = newConsole(m.gate, Config{Pool: s.Pool, Schema: schema, PageSize: m.cfg.PageSize, Refresh: m.cfg.Refresh}, base)
		if err != nil {
			m.mu.Unlock()
			http.Error(w, "source "+safeText(database)+"/"+safeText(schema)+": "+err.Error(), http.StatusInternalServerError)
			return
		}
		// The links are escaped (base); the request's path, unescaped.
		c.database, c.handler = database, http.StripPrefix("/sources/"+database+"/"+schema, c.routes())
		m.pages[key] = c
	}
	m.mu.Unlock()
	c.handler.ServeHTTP(w, r)
}
