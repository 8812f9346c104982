package outboxfleet

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/redact"
)

// Defaults for Config.Relay.
const (
	// PollIntervalDefault is how often a database's idle sources are looked
	// at, all in one statement.
	PollIntervalDefault = time.Second
	// IdleMaxDefault is the longest an idle source's own polls and upkeep
	// wait (outbox.RelayConfig.IdleBackoffMax).
	IdleMaxDefault = 10 * time.Minute
	// DiscoverIntervalDefault is how often the schemas of a database are
	// listed for the sources given by a pattern.
	DiscoverIntervalDefault = 30 * time.Second
	// MaxConnsDefault is the size of a database's shared pool.
	MaxConnsDefault = 8
)

// Config is a fleet's configuration: the file given to
// `outbox relay --config`. Load or Parse reads it; the zero values of the
// durations mean their defaults.
type Config struct {
	// Relay holds the settings shared by every source's relay.
	Relay RelaySettings `yaml:"relay"`
	// Databases are the databases the sources live in, by name.
	Databases map[string]Database `yaml:"databases"`
	// Destinations are where events go, by name.
	Destinations map[string]Destination `yaml:"destinations"`
	// Sources are the outboxes served, in order: a schema matched by two
	// entries is served by the first.
	Sources []Source `yaml:"sources"`
}

// RelaySettings are the settings every source's relay shares.
type RelaySettings struct {
	// ID prefixes each source's relay ID (claimed_by): "<ID>/<database>/<schema>".
	// Defaults to host-pid.
	ID string `yaml:"id"`
	// BatchSize is the most events claimed per round trip, per source.
	// Defaults to outbox.BatchSizeDefault.
	BatchSize int `yaml:"batch_size"`
	// PollInterval is how often the idle sources of a database are looked
	// at for due events, all of them in one statement, so that events
	// written without a wake-up go out within it. Defaults to
	// PollIntervalDefault.
	PollInterval time.Duration `yaml:"poll_interval"`
	// IdleMax is the longest an idle source's own poll and periodic upkeep
	// (heartbeat, lane sweep, vacuum, clean-up) wait
	// (outbox.RelayConfig.IdleBackoffMax). Defaults to IdleMaxDefault.
	IdleMax time.Duration `yaml:"idle_max"`
	// DiscoverInterval is how often each database with a schema pattern is
	// listed for schemas that appeared or were dropped. Defaults to
	// DiscoverIntervalDefault.
	DiscoverInterval time.Duration `yaml:"discover_interval"`
	// Lease, HeartbeatInterval, MaxAttempts, LaneSweepInterval,
	// VacuumInterval and RescanInterval are the outbox.RelayConfig fields
	// of the same names; zero means their defaults.
	Lease             time.Duration `yaml:"lease"`
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	MaxAttempts       int           `yaml:"max_attempts"`
	LaneSweepInterval time.Duration `yaml:"lane_sweep_interval"`
	VacuumInterval    time.Duration `yaml:"vacuum_interval"`
	RescanInterval    time.Duration `yaml:"rescan_interval"`
}

// Database is one PostgreSQL database: its sources share one pool of at most
// MaxConns connections and one LISTEN connection; the look for due events
// in idle sources has one more connection of its own.
type Database struct {
	// URL is the connection URL or key=value string. A ${NAME} in it is
	// replaced by the environment variable NAME (an unset one is an error),
	// so that a password need not be written in the file.
	URL string `yaml:"url"`
	// URLFile names a file holding the URL instead (a mounted secret);
	// ${NAME} works there too. Exactly one of URL and URLFile is set.
	URLFile string `yaml:"url_file"`
	// MaxConns bounds the shared pool. Defaults to MaxConnsDefault.
	MaxConns int32 `yaml:"max_conns"`
	// TrustedOwners are the roles that may own a served schema and its
	// outbox tables; empty means the role the URL connects as
	// (current_user) only. A schema (named or matched by a pattern) owned
	// otherwise, or whose outbox tables are not tables (a view, a foreign
	// table) or carry a trigger of an untrusted role's function, is not
	// served: state "untrusted", naming the object and its owner. The
	// relay runs the code of what it reads (a view's function, a
	// trigger) with its own role: a tenant owning its schema must not be
	// trusted. Compared by name, not by membership. Set it to the
	// migration role when the tables are owned by one role and the relay
	// connects as another (the least-privileged setup). It is per database
	// because ownership and the connecting role are the database's.
	TrustedOwners []string `yaml:"trusted_owners"`
}

// Destination is one destination, opened once and shared by every source
// that routes to it.
type Destination struct {
	// URL is the destination URL, as for `outbox relay --destination`;
	// ${NAME} is replaced by the environment variable NAME.
	URL string `yaml:"url"`
	// URLFile names a file holding the URL instead.
	URLFile string `yaml:"url_file"`
}

// Source is one outbox, or every outbox whose schema matches a pattern, in
// one database, with where its events go.
type Source struct {
	// Database names an entry of Config.Databases.
	Database string `yaml:"database"`
	// Schema is the schema of one outbox. Exactly one of Schema and
	// SchemaPattern is set.
	Schema string `yaml:"schema"`
	// SchemaPattern selects every schema of the database whose name matches
	// it (path.Match syntax: "tenant_*", "svc_?"), discovered as they appear
	// (once fully migrated) and retired when dropped.
	SchemaPattern string `yaml:"schema_pattern"`
	// Destination names an entry of Config.Destinations: every event goes
	// there. Exactly one of Destination and Routes is set.
	Destination string `yaml:"destination"`
	// Routes send each aggregate type to one destination. A route without
	// AggregateTypes takes every type no other route names; without one,
	// an event of an unnamed type fails as permanent and is quarantined.
	Routes []Route `yaml:"routes"`
}

// Route sends the events of some aggregate types to one destination. An
// aggregate type appears in one route at most, so that every event of an
// aggregate goes to the same destination, in order.
type Route struct {
	AggregateTypes []string `yaml:"aggregate_types"`
	Destination    string   `yaml:"destination"`
}

// Load reads, expands and checks the configuration file at path.
func Load(file string) (Config, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", file, err)
	}
	return cfg, nil
}

// Parse reads a configuration from YAML, refusing unknown keys, replaces the
// ${NAME} references and url_file entries by their values, and checks it.
// Its errors never quote a URL.
func Parse(data []byte) (Config, error) {
	var cfg Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		if errors.Is(err, io.EOF) { // an empty document
			return Config{}, errors.New("empty configuration: it needs databases, destinations and sources")
		}
		var te *yaml.TypeError
		if errors.As(err, &te) {
			// One line: "line 3: field pol_interval not found in type ...".
			return Config{}, errors.New(strings.Join(te.Errors, "; "))
		}
		return Config{}, errors.New(strings.TrimPrefix(err.Error(), "yaml: "))
	}
	// A second document (a stray "---", two files concatenated) would be
	// silently ignored: its settings and sources never applied.
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return Config{}, errors.New("the configuration has a second YAML document (after ---); put everything in one document")
	}
	for name, db := range cfg.Databases {
		u, err := secretValue("databases."+name, db.URL, db.URLFile)
		if err != nil {
			return Config{}, err
		}
		db.URL, db.URLFile = u, ""
		cfg.Databases[name] = db
	}
	for name, d := range cfg.Destinations {
		u, err := secretValue("destinations."+name, d.URL, d.URLFile)
		if err != nil {
			return Config{}, err
		}
		d.URL, d.URLFile = u, ""
		cfg.Destinations[name] = d
	}
	if err := cfg.validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// secretValue returns the value of a url/url_file pair with its ${NAME}
// references replaced.
func secretValue(where, value, file string) (string, error) {
	switch {
	case value != "" && file != "":
		return "", fmt.Errorf("%s: set url or url_file, not both", where)
	case value == "" && file == "":
		return "", fmt.Errorf("%s: url (or url_file) is required", where)
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("%s: url_file: %w", where, err)
		}
		value = strings.TrimSpace(string(b))
		if value == "" {
			return "", fmt.Errorf("%s: url_file %s is empty", where, file)
		}
	}
	var missing []string
	out := envRef.ReplaceAllStringFunc(value, func(ref string) string {
		name := envRef.FindStringSubmatch(ref)[1]
		v, ok := os.LookupEnv(name)
		if !ok {
			missing = append(missing, name)
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("%s: url refers to unset environment variable %s", where, strings.Join(missing, ", "))
	}
	return out, nil
}

func (c Config) validate() error {
	r := c.Relay
	switch {
	case r.BatchSize < 0:
		return fmt.Errorf("relay.batch_size %d must be positive", r.BatchSize)
	case r.MaxAttempts < 0:
		return fmt.Errorf("relay.max_attempts %d must be positive", r.MaxAttempts)
	case r.PollInterval < 0, r.IdleMax < 0, r.DiscoverInterval < 0, r.Lease < 0, r.HeartbeatInterval < 0,
		r.LaneSweepInterval < 0:
		return errors.New("relay: durations must not be negative (vacuum_interval and rescan_interval excepted)")
	case r.IdleMax > outbox.RelayHeartbeatLifetimeMax/3, r.HeartbeatInterval > outbox.RelayHeartbeatLifetimeMax/3:
		return fmt.Errorf("relay: idle_max %s and heartbeat_interval %s must be at most %s (a heartbeat row lives three waits; status believes one for %s at most)",
			r.IdleMax, r.HeartbeatInterval, outbox.RelayHeartbeatLifetimeMax/3, outbox.RelayHeartbeatLifetimeMax)
	}
	if len(c.Databases) == 0 {
		return errors.New("databases: none configured")
	}
	if len(c.Destinations) == 0 {
		return errors.New("destinations: none configured")
	}
	if len(c.Sources) == 0 {
		return errors.New("sources: none configured")
	}
	for name := range c.Destinations {
		if err := pgident.ValidateKey(name); err != nil {
			return fmt.Errorf("destinations: %w", err)
		}
	}
	for name, db := range c.Databases {
		if err := pgident.ValidateKey(name); err != nil {
			return fmt.Errorf("databases: %w", err)
		}
		for _, o := range db.TrustedOwners {
			if o == "" {
				return fmt.Errorf("databases.%s.trusted_owners: an empty role name", name)
			}
		}
		if db.MaxConns < 0 || db.MaxConns == 1 {
			return fmt.Errorf("databases.%s.max_conns %d: at least 2 (a relay needs a connection for its claims and one for its marks)", name, db.MaxConns)
		}
	}
	used := map[string]bool{}
	schemas := map[string]int{} // database/schema -> source index
	for i, s := range c.Sources {
		where := fmt.Sprintf("sources[%d]", i)
		if _, ok := c.Databases[s.Database]; !ok {
			return fmt.Errorf("%s: database %q is not in databases (%s)", where, s.Database, strings.Join(keys(c.Databases), ", "))
		}
		switch {
		case (s.Schema == "") == (s.SchemaPattern == ""):
			return fmt.Errorf("%s: set schema or schema_pattern, not both nor neither", where)
		case s.Schema != "":
			if _, err := pgident.NewSchema(s.Schema); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
			key := s.Database + "/" + s.Schema
			if j, dup := schemas[key]; dup {
				return fmt.Errorf("%s: schema %s of database %s is already sources[%d]", where, s.Schema, s.Database, j)
			}
			schemas[key] = i
		default:
			if _, err := path.Match(s.SchemaPattern, ""); err != nil {
				return fmt.Errorf("%s: schema_pattern %q: %w", where, s.SchemaPattern, err)
			}
		}
		dests, err := s.destinations(c.Destinations, where)
		if err != nil {
			return err
		}
		for _, d := range dests {
			used[d] = true
		}
	}
	for name := range c.Destinations {
		if !used[name] {
			return fmt.Errorf("destinations.%s: no source routes to it", name)
		}
	}
	return nil
}

// destinations checks a source's route and returns the destinations it
// names.
func (s Source) destinations(all map[string]Destination, where string) ([]string, error) {
	known := func(name, at string) error {
		if _, ok := all[name]; !ok {
			return fmt.Errorf("%s: destination %q is not in destinations (%s)", at, name, strings.Join(keys(all), ", "))
		}
		return nil
	}
	switch {
	case (s.Destination == "") == (len(s.Routes) == 0):
		return nil, fmt.Errorf("%s: set destination or routes, not both nor neither", where)
	case s.Destination != "":
		return []string{s.Destination}, known(s.Destination, where)
	}
	var out []string
	owner := map[string]int{}
	fallback := -1
	for i, r := range s.Routes {
		at := fmt.Sprintf("%s.routes[%d]", where, i)
		if err := known(r.Destination, at); err != nil {
			return nil, err
		}
		out = append(out, r.Destination)
		if len(r.AggregateTypes) == 0 {
			if fallback >= 0 {
				return nil, fmt.Errorf("%s: a second route without aggregate_types (the first is routes[%d]): only one may take the other types", at, fallback)
			}
			fallback = i
		}
		for _, t := range r.AggregateTypes {
			if t == "" {
				return nil, fmt.Errorf("%s: an empty aggregate type", at)
			}
			if j, dup := owner[t]; dup {
				return nil, fmt.Errorf("%s: aggregate type %q is already routed by routes[%d]: an aggregate type goes to one destination, so that its aggregates' events stay in order", at, t, j)
			}
			owner[t] = i
		}
	}
	return out, nil
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// String describes the configuration with every URL's secrets removed.
func (c Config) String() string {
	var b strings.Builder
	for _, name := range keys(c.Databases) {
		db := c.Databases[name]
		maxConns := db.MaxConns
		if maxConns == 0 {
			maxConns = MaxConnsDefault
		}
		owners := "the connecting role"
		if len(db.TrustedOwners) > 0 {
			owners = strings.Join(db.TrustedOwners, ",")
		}
		fmt.Fprintf(&b, "database %s: %s (max_conns %d, trusted_owners %s)\n", name, redact.Database(db.URL), maxConns, owners)
	}
	for _, name := range keys(c.Destinations) {
		fmt.Fprintf(&b, "destination %s: %s\n", name, redact.URL(c.Destinations[name].URL))
	}
	for _, s := range c.Sources {
		what := "schema " + s.Schema
		if s.SchemaPattern != "" {
			what = "schemas " + s.SchemaPattern
		}
		route := "-> " + s.Destination
		if len(s.Routes) > 0 {
			var rs []string
			for _, r := range s.Routes {
				types := "other types"
				if len(r.AggregateTypes) > 0 {
					types = strings.Join(slices.Sorted(slices.Values(r.AggregateTypes)), ",")
				}
				rs = append(rs, types+" -> "+r.Destination)
			}
			route = strings.Join(rs, "; ")
		}
		fmt.Fprintf(&b, "source %s %s: %s\n", s.Database, what, route)
	}
	return b.String()
}

// withDefaults fills the zero settings.
func (r RelaySettings) withDefaults() RelaySettings {
	if r.ID == "" {
		host, _ := os.Hostname()
		r.ID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if r.BatchSize == 0 {
		r.BatchSize = outbox.BatchSizeDefault
	}
	if r.PollInterval == 0 {
		r.PollInterval = PollIntervalDefault
	}
	if r.IdleMax == 0 {
		r.IdleMax = IdleMaxDefault
	}
	if r.DiscoverInterval == 0 {
		r.DiscoverInterval = DiscoverIntervalDefault
	}
	return r
}
