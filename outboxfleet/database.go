package outboxfleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtrust"
	"github.com/pgoutbox/outbox/outboxmigrate"
	"github.com/pgoutbox/outbox/outboxprom"
)

// sourceSpec is an entry of Config.Sources, with its place in the file.
type sourceSpec struct {
	index int
	Source
}

// database is one database of the fleet: its pool, its sources, the
// discovery of its schemas, the shared LISTEN and the look for due events.
type database struct {
	f     *Fleet
	name  string
	pool  *pgxpool.Pool
	specs []sourceSpec

	mu      sync.Mutex
	sources map[string]*source // running or failed, by schema
	missing map[string]error   // schemas named in the config that are not there
	waiting map[string]int     // schemas found at an older migration: their version
	// unreadable: schemas whose migration version the relay cannot read
	// (no grants, say): why. The others are served all the same.
	unreadable map[string]error
	// untrusted: schemas not served because an untrusted role owns them
	// or one of their outbox tables, or a table is not one (pgtrust): why.
	untrusted map[string]error
	discover  error  // the last discovery's error, nil when it worked
	listed    bool   // a discovery worked once
	control   string // the listener's control channel; "" while it is not listening
	// rediscover makes the discovery run now (a look found a schema gone).
	rediscover chan struct{}
	wg         sync.WaitGroup // the sources' relays
}

// source is one outbox served by the fleet.
type source struct {
	db     *database
	name   string // "<database>/<schema>"
	schema string
	spec   sourceSpec
	relay  *outbox.Relay
	obs    *sourceObserver
	cancel context.CancelFunc
	done   chan struct{}
	err    atomic.Pointer[error] // set when Run returned an error

	started time.Time // when its relay was started

	// The look's state (look.go), touched by the look loop only.
	lookEvery time.Duration
	nextLook  time.Time
	wokeAt    time.Time
}

func (d *database) log() *slog.Logger { return d.f.log.With(slog.String("database", d.name)) }

// run serves the database's sources until ctx ends, then stops them.
func (d *database) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); d.listenLoop(ctx) }()
	go func() { defer wg.Done(); d.lookLoop(ctx) }()
	d.discoverLoop(ctx)
	wg.Wait()
	d.mu.Lock()
	for _, s := range d.sources {
		s.cancel()
	}
	d.mu.Unlock()
	d.wg.Wait()
	d.mu.Lock()
	for schema, s := range d.sources {
		d.unregister(s)
		delete(d.sources, schema)
	}
	d.mu.Unlock()
}

// discoverLoop lists the database's schemas at once and then every
// DiscoverInterval (sooner after a failure, with backoff, or when a look
// found a schema gone), starting and retiring sources.
func (d *database) discoverLoop(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		err := d.discoverOnce(ctx)
		d.mu.Lock()
		d.discover = err
		d.listed = d.listed || err == nil
		d.mu.Unlock()
		wait := d.f.set.DiscoverInterval
		if err != nil && ctx.Err() == nil {
			failures++
			wait = min(wait, backoff.Jittered(failures, 100*time.Millisecond, 10*time.Second))
			if failures == 1 {
				d.log().Warn("list the database's outbox schemas (sources keep running; retrying)", slog.Any("error", err))
			}
		} else {
			failures = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-t.C:
		case <-d.rediscover:
		}
		t.Stop()
	}
}

// schemasSQL lists the schemas holding an outbox_events table.
const schemasSQL = `SELECT DISTINCT n.nspname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = 'outbox_events' AND c.relkind IN ('r', 'p')`

func (d *database) discoverOnce(ctx context.Context) error {
	list, err := ListSchemas(ctx, d.pool)
	if err != nil {
		return err
	}
	present := map[string]bool{}
	for _, s := range list {
		present[s] = true
	}
	want, missing := match(d.specs, present)
	latest := outboxmigrate.All()
	latestVersion := latest[len(latest)-1].Version
	untrusted := d.checkTrust(ctx, want)

	d.mu.Lock()
	d.missing = missing
	var retire []*source
	for schema, s := range d.sources {
		if sp, ok := want[schema]; !ok || sp.index != s.spec.index || untrusted[schema] {
			retire = append(retire, s)
			delete(d.sources, schema)
		}
	}
	var start []string
	for schema := range want {
		s, ok := d.sources[schema]
		if ok && s.err.Load() == nil {
			continue
		}
		if untrusted[schema] {
			continue
		}
		if ok { // its relay stopped on an error: start it again
			delete(d.sources, schema)
			d.unregister(s)
		}
		start = append(start, schema)
	}
	d.mu.Unlock()
	sort.Strings(start)

	for _, s := range retire {
		d.retire(s)
	}
	changed := len(retire) > 0
	// Their versions in one statement, then each started: start-up and
	// discovery cost two statements, however many schemas appeared.
	versions, err := outboxmigrate.Versions(ctx, d.pool, start)
	if err != nil {
		if versions, err = d.versionsOneByOne(ctx, start); err != nil {
			return fmt.Errorf("read the migration versions: %w", err)
		}
	}
	for _, schema := range start {
		if ctx.Err() != nil {
			break
		}
		v, ok := versions[schema]
		d.mu.Lock()
		if !ok { // unreadable: reported in its status
			d.mu.Unlock()
			continue
		}
		delete(d.unreadable, schema)
		if v < latestVersion {
			if d.waiting[schema] != v {
				d.log().Info("schema found, waiting for its migrations before serving it", slog.String("schema", schema),
					slog.Int("version", v), slog.Int("latest", latestVersion))
			}
			d.waiting[schema] = v
			d.mu.Unlock()
			continue
		}
		delete(d.waiting, schema)
		d.mu.Unlock()
		if err := d.start(ctx, schema, want[schema]); err != nil {
			d.log().Error("start source", slog.String("schema", schema), slog.Any("error", err))
			continue
		}
		changed = true
	}
	d.mu.Lock()
	for schema := range d.waiting {
		if _, ok := want[schema]; !ok {
			delete(d.waiting, schema)
		}
	}
	for schema := range d.unreadable {
		if _, ok := want[schema]; !ok {
			delete(d.unreadable, schema)
		}
	}
	for schema := range d.untrusted {
		if _, ok := want[schema]; !ok {
			delete(d.untrusted, schema)
		}
	}
	d.mu.Unlock()
	if changed {
		d.listenChanged(ctx)
	}
	return nil
}

// checkTrust checks the owners and kinds of every wanted schema, running
// or not, in one statement (pgtrust.CheckAll, against the database's
// trusted_owners), before any table of a new one is read: those refused are
// recorded in d.untrusted and returned; those that pass leave it. A running
// source is checked again at every discovery because its tables' owner can
// change, or a trigger be added, after it started: one refused is stopped by
// discoverOnce. When the statement fails, the schemas not running are
// refused until the next discovery; the running ones keep running (they
// passed their last check).
func (d *database) checkTrust(ctx context.Context, want map[string]sourceSpec) map[string]bool {
	d.mu.Lock()
	schemas := make([]string, 0, len(want))
	isRunning := map[string]bool{}
	for schema := range want {
		schemas = append(schemas, schema)
		if s, ok := d.sources[schema]; ok && s.err.Load() == nil {
			isRunning[schema] = true
		}
	}
	d.mu.Unlock()
	sort.Strings(schemas)
	trusted := d.f.cfg.Databases[d.name].TrustedOwners
	errs, err := pgtrust.CheckAll(ctx, d.pool, schemas, trusted)
	out := map[string]bool{}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, schema := range schemas {
		why := errs[schema]
		if err != nil {
			if isRunning[schema] {
				continue
			}
			why = fmt.Errorf("check the owners of schema %s: %w", schema, err)
		}
		if why == nil {
			delete(d.untrusted, schema)
			continue
		}
		if d.untrusted[schema] == nil || d.untrusted[schema].Error() != why.Error() {
			msg := "schema not served: it is not trusted (the others are)"
			if isRunning[schema] {
				msg = "source no longer trusted: it is stopped (the others are served)"
			}
			d.log().Warn(msg, slog.String("schema", schema), slog.Any("error", why))
		}
		d.untrusted[schema] = why
		out[schema] = true
	}
	return out
}

// versionsOneByOne reads the migration version of each schema on its own,
// after the one statement for all of them failed: a schema the server
// refuses (no grants on it, say) is recorded as unreadable, named with the
// error, and left out, so that it does not keep the others from being
// served. An error that is not the server's answer (the connection) is
// returned.
func (d *database) versionsOneByOne(ctx context.Context, schemas []string) (map[string]int, error) {
	out := make(map[string]int, len(schemas))
	for _, schema := range schemas {
		v, err := outboxmigrate.Versions(ctx, d.pool, []string{schema})
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			out[schema] = v[schema]
		case errors.As(err, &pgErr):
			d.mu.Lock()
			if d.unreadable[schema] == nil {
				d.log().Warn("cannot read the schema's migration version; it is not served (the others are)",
					slog.String("schema", schema), slog.Any("error", err))
			}
			d.unreadable[schema] = err
			d.mu.Unlock()
		default:
			return nil, err
		}
	}
	return out, nil
}

// start starts the relay of a source.
func (d *database) start(ctx context.Context, schema string, sp sourceSpec) error {
	name := d.name + "/" + schema
	pub, err := d.f.publisher(sp.Source)
	if err != nil {
		return err
	}
	set := d.f.set
	s := &source{db: d, name: name, schema: schema, spec: sp, done: make(chan struct{}), started: time.Now()}
	s.obs = &sourceObserver{}
	if d.f.opts.Registerer != nil {
		m, err := outboxprom.New(outboxprom.Config{Schema: schema, Logger: d.f.log,
			ConstLabels: map[string]string{"source": name, "database": d.name}})
		if err != nil {
			return err
		}
		if err := d.f.opts.Registerer.Register(m); err != nil {
			return fmt.Errorf("register the metrics of source %s: %w", name, err)
		}
		s.obs.metrics = m
	}
	cfg := outbox.RelayConfig{
		Publisher: pub, Schema: schema, ID: set.ID + "/" + name,
		// The relay's own poll is a backstop: the look (look.go) finds
		// due events in idle sources every PollInterval, so the relay
		// polls every IdleMax.
		BatchSize: set.BatchSize, LeaseDuration: set.Lease, PollInterval: set.IdleMax,
		MaxAttempts: set.MaxAttempts, HeartbeatInterval: set.HeartbeatInterval,
		LaneSweepInterval: set.LaneSweepInterval, VacuumInterval: set.VacuumInterval, RescanInterval: set.RescanInterval,
		// The fleet's listener wakes the relay (one LISTEN connection for
		// the database), and its look finds due events in idle sources:
		// the relay's own polls and upkeep back off while it is idle.
		DisableNotify: true, IdleBackoffMax: set.IdleMax,
		Logger: d.f.sourceLog.With(slog.String("source", name)), Observer: s.obs,
	}
	if d.f.opts.ConfigureRelay != nil {
		d.f.opts.ConfigureRelay(name, &cfg)
	}
	r, err := outbox.NewRelay(d.pool, cfg)
	if err != nil {
		d.unregister(s)
		return err
	}
	s.relay = r
	rctx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	d.mu.Lock()
	d.sources[schema] = s
	d.mu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer close(s.done)
		if err := r.Run(rctx); err != nil {
			s.err.Store(&err)
			d.log().Error("source's relay stopped; it starts again at the next discovery", slog.String("source", name), slog.Any("error", err))
		}
	}()
	if d.f.fleet != nil {
		d.f.fleet.started.Inc()
	}
	d.log().Info("source started", slog.String("source", name))
	return nil
}

// retire stops a source whose schema was dropped (or that another entry now
// serves) and waits for its relay.
func (d *database) retire(s *source) {
	s.cancel()
	<-s.done
	d.unregister(s)
	if d.f.fleet != nil {
		d.f.fleet.retired.Inc()
	}
	d.log().Info("source retired", slog.String("source", s.name))
}

func (d *database) unregister(s *source) {
	if s.obs != nil && s.obs.metrics != nil && d.f.opts.Registerer != nil {
		d.f.opts.Registerer.Unregister(s.obs.metrics)
	}
}

// running returns the sources whose relay runs.
func (d *database) running() []*source {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*source, 0, len(d.sources))
	for _, s := range d.sources {
		if s.err.Load() == nil {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].schema < out[j].schema })
	return out
}

func (d *database) discoverErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.discover == nil && !d.listed {
		return errors.New("its schemas are not listed yet")
	}
	return d.discover
}

func (d *database) status() []SourceStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []SourceStatus
	for schema, s := range d.sources {
		st := SourceStatus{Name: s.name, Database: d.name, Schema: schema, State: "running", Stats: s.relay.Stats()}
		if p := s.err.Load(); p != nil {
			st.State, st.Ready = "failed", *p
		} else {
			st.Ready = s.relay.Ready()
		}
		out = append(out, st)
	}
	for schema, err := range d.missing {
		out = append(out, SourceStatus{Name: d.name + "/" + schema, Database: d.name, Schema: schema, State: "missing", Ready: err})
	}
	for schema, err := range d.unreadable {
		out = append(out, SourceStatus{Name: d.name + "/" + schema, Database: d.name, Schema: schema, State: "unreadable",
			Ready: fmt.Errorf("cannot read schema %s's migration version (grants?): %w", schema, err)})
	}
	for schema, err := range d.untrusted {
		out = append(out, SourceStatus{Name: d.name + "/" + schema, Database: d.name, Schema: schema, State: "untrusted",
			Ready: fmt.Errorf("schema %s not served (its code would run with the relay's role): %w", schema, err)})
	}
	for schema, v := range d.waiting {
		out = append(out, SourceStatus{Name: d.name + "/" + schema, Database: d.name, Schema: schema, State: "waiting",
			Ready: fmt.Errorf("schema at migration version %d: waiting for 'outbox migrate' to finish", v)})
	}
	return out
}

// errSchemaGone marks a look that failed because a schema was dropped.
var errSchemaGone = errors.New("a schema was dropped")

// ListSchemas lists the schemas of the database that hold an outbox_events
// table, sorted.
func ListSchemas(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}) ([]string, error) {
	rows, err := db.Query(ctx, schemasSQL+" ORDER BY 1")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Match returns the schemas of database that the configuration serves,
// given the schemas that hold outbox tables there (ListSchemas), and the
// schemas it names that are not among them. Both are sorted.
func (c Config) Match(database string, present []string) (serve, missing []string) {
	var specs []sourceSpec
	for i, s := range c.Sources {
		if s.Database == database {
			specs = append(specs, sourceSpec{index: i, Source: s})
		}
	}
	set := map[string]bool{}
	for _, s := range present {
		set[s] = true
	}
	want, miss := match(specs, set)
	for s := range want {
		serve = append(serve, s)
	}
	for s := range miss {
		missing = append(missing, s)
	}
	sort.Strings(serve)
	sort.Strings(missing)
	return serve, missing
}

// match decides which entry serves which schema: the first entry that names
// or matches it. Schemas an entry names that are not present are missing.
func match(specs []sourceSpec, present map[string]bool) (map[string]sourceSpec, map[string]error) {
	want := map[string]sourceSpec{}
	missing := map[string]error{}
	sorted := make([]string, 0, len(present))
	for s := range present {
		sorted = append(sorted, s)
	}
	sort.Strings(sorted)
	for _, sp := range specs {
		if sp.Schema != "" {
			if _, taken := want[sp.Schema]; taken {
				continue
			}
			if present[sp.Schema] {
				want[sp.Schema] = sp
			} else {
				missing[sp.Schema] = fmt.Errorf("schema %s has no outbox tables (sources[%d]; run 'outbox migrate --schema %s')", sp.Schema, sp.index, sp.Schema)
			}
			continue
		}
		for _, s := range sorted {
			if _, taken := want[s]; taken {
				continue
			}
			if ok, _ := path.Match(sp.SchemaPattern, s); !ok {
				continue
			}
			if _, err := pgident.NewSchema(s); err != nil {
				continue // a name the outbox cannot hold (outbox migrate refuses it)
			}
			want[s] = sp
		}
	}
	return want, missing
}
