package outboxfleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/redact"
)

// Options are what a Fleet needs besides its Config.
type Options struct {
	// OpenDestination opens the publisher of a destination (name and URL
	// from Config.Destinations) and returns it with the function that
	// closes it; Run calls it once per destination, before any source
	// starts. cmd/outbox passes the opener of `outbox relay --destination`.
	// Required.
	OpenDestination func(ctx context.Context, name, url string) (outbox.Publisher, func(), error)
	// ConfigurePool, when set, adjusts each database's pool configuration
	// before the pool is made (session parameters, a tracer). Optional.
	ConfigurePool func(*pgxpool.Config)
	// ConfigureRelay, when set, adjusts each source's relay configuration
	// after the fleet filled it in. Optional.
	ConfigureRelay func(source string, cfg *outbox.RelayConfig)
	// Registerer, when set, receives the metrics of every source (package
	// outboxprom's series, with the labels source="<database>/<schema>" and
	// database), registered when the source starts and unregistered when it
	// is retired, and the fleet's own (outbox_fleet_*). Optional.
	Registerer prometheus.Registerer
	// Logger receives the fleet's logs; each source's relay logs with the
	// attribute source. Defaults to slog.Default().
	Logger *slog.Logger
}

// Fleet relays the events of many outboxes in one process: the sources of
// a Config, each served by an outbox.Relay over its database's shared pool
// (see the package documentation).
type Fleet struct {
	cfg  Config
	set  RelaySettings
	opts Options
	log  *slog.Logger
	// sourceLog is the sources' relays' logger: log, with what each of
	// them logs alike about a destination logged once (logonce.go).
	sourceLog *slog.Logger
	dbs       []*database
	fleet     *fleetMetrics

	mu   sync.Mutex
	pubs map[string]outbox.Publisher // by destination name, once Run opened them
}

// New checks opts and makes the pools of cfg's databases (they connect when
// first used, so a database that is down does not stop New). Run starts the
// fleet; Close closes the pools.
func New(cfg Config, opts Options) (*Fleet, error) {
	if opts.OpenDestination == nil {
		return nil, errors.New("outboxfleet: Options.OpenDestination is required")
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("outboxfleet: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	f := &Fleet{cfg: cfg, set: cfg.Relay.withDefaults(), opts: opts, log: opts.Logger,
		sourceLog: slog.New(onceHandler{Handler: opts.Logger.Handler(), once: &onceLines{}})}
	if opts.Registerer != nil {
		m, err := newFleetMetrics(opts.Registerer)
		if err != nil {
			return nil, err
		}
		f.fleet = m
	}
	for _, name := range keys(cfg.Databases) {
		db := cfg.Databases[name]
		pc, err := pgxpool.ParseConfig(db.URL)
		if err != nil {
			f.Close()
			return nil, redact.Error(fmt.Errorf("outboxfleet: databases.%s: url: %w", name, err), redact.DatabaseSecrets(db.URL)...)
		}
		pc.MaxConns = MaxConnsDefault
		if db.MaxConns > 0 {
			pc.MaxConns = db.MaxConns
		}
		pc.MinConns = 0
		if opts.ConfigurePool != nil {
			opts.ConfigurePool(pc)
		}
		pool, err := pgxpool.NewWithConfig(context.Background(), pc)
		if err != nil {
			f.Close()
			return nil, redact.Error(fmt.Errorf("outboxfleet: databases.%s: %w", name, err), redact.DatabaseSecrets(db.URL)...)
		}
		d := &database{f: f, name: name, pool: pool, sources: map[string]*source{}, missing: map[string]error{},
			waiting: map[string]int{}, unreadable: map[string]error{}, untrusted: map[string]error{}, rediscover: make(chan struct{}, 1)}
		for i, s := range cfg.Sources {
			if s.Database == name {
				d.specs = append(d.specs, sourceSpec{index: i, Source: s})
			}
		}
		f.dbs = append(f.dbs, d)
	}
	return f, nil
}

// Close closes the databases' pools. Call it after Run returned.
func (f *Fleet) Close() {
	for _, d := range f.dbs {
		d.pool.Close()
	}
}

// Pool returns the shared pool of the database named name, or nil.
func (f *Fleet) Pool(name string) *pgxpool.Pool {
	for _, d := range f.dbs {
		if d.name == name {
			return d.pool
		}
	}
	return nil
}

// Run opens the destinations, then serves every source until ctx ends:
// per database, it lists the schemas (at start and every
// DiscoverInterval), starts a relay for each source found fully migrated and
// retires the relays of schemas dropped, holds one LISTEN connection for all
// the sources' channels, and looks for due events in the idle sources once
// per PollInterval. When ctx ends every relay stops (finishing or releasing
// its work) and Run returns nil; it returns an error only when a
// destination cannot be opened.
func (f *Fleet) Run(ctx context.Context) error {
	pubs := map[string]outbox.Publisher{}
	for _, name := range keys(f.cfg.Destinations) {
		pub, closePub, err := f.opts.OpenDestination(ctx, name, f.cfg.Destinations[name].URL)
		if err != nil {
			return redact.Error(fmt.Errorf("destinations.%s: %w", name, err), redact.DatabaseSecrets(f.cfg.Destinations[name].URL)...)
		}
		if closePub != nil {
			defer closePub()
		}
		pubs[name] = pub
	}
	f.mu.Lock()
	f.pubs = pubs
	f.mu.Unlock()
	f.log.Info("fleet started", slog.Int("databases", len(f.dbs)), slog.Int("source_entries", len(f.cfg.Sources)))
	var wg sync.WaitGroup
	for _, d := range f.dbs {
		wg.Add(1)
		go func() { defer wg.Done(); d.run(ctx) }()
	}
	wg.Wait()
	f.log.Info("fleet stopped")
	return nil
}

// publisher returns the publisher of a source's route.
func (f *Fleet) publisher(s Source) (outbox.Publisher, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pubs == nil {
		return nil, errors.New("destinations not open")
	}
	if s.Destination != "" {
		return f.pubs[s.Destination], nil
	}
	return newRouted(s.Routes, f.pubs), nil
}

// SourceStatus is one source as the fleet sees it.
type SourceStatus struct {
	// Name is "<database>/<schema>".
	Name, Database, Schema string
	// State is "running", "waiting" (found, not yet at the latest
	// migration), "missing" (a schema named in the config that has no
	// outbox tables), "unreadable" (a schema whose migration version the
	// relay's role cannot read; the others are served), "untrusted" (a
	// schema, or one of its outbox tables, owned by a role not in the
	// database's trusted_owners, or a table that is not one: Ready names
	// the object and its owner; it is never read beyond the catalogue) or
	// "failed" (its relay stopped on an error; it is
	// started again at the next discovery).
	State string
	// Ready is the relay's readiness (nil: ready), or why the source is not
	// running.
	Ready error
	// Stats are the relay's running totals.
	Stats outbox.RelayStats
}

// Sources lists the sources of every database, sorted by name.
func (f *Fleet) Sources() []SourceStatus {
	var out []SourceStatus
	for _, d := range f.dbs {
		out = append(out, d.status()...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Ready reports whether every source is served: nil, or an error naming each
// database that cannot be reached and each source that is not ready, with
// the reason. It backs /readyz of `outbox relay --config`.
func (f *Fleet) Ready() error {
	f.mu.Lock()
	opened := f.pubs != nil
	f.mu.Unlock()
	if !opened {
		return errors.New("starting: opening the destinations")
	}
	var down []string
	for _, d := range f.dbs {
		if err := d.discoverErr(); err != nil {
			down = append(down, fmt.Sprintf("database %s: %v", d.name, err))
		}
	}
	for _, s := range f.Sources() {
		if s.Ready != nil {
			down = append(down, fmt.Sprintf("source %s: %v", s.Name, s.Ready))
		}
	}
	if len(down) == 0 {
		return nil
	}
	return errors.New(strings.Join(down, "; "))
}
