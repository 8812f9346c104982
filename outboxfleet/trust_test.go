package outboxfleet_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxfleet"
)

// TestAdvUntrustedSchemaNotServed: of three schemas a pattern matches, one
// has its outbox_relays owned by a tenant role, one has its outbox_relays
// replaced by a view (owned by the trusted role): neither is served, each
// shows as "untrusted" naming the object (and the owner), Ready names
// them; the trusted one is served and publishes. Then the tenant's table
// is handed back to the trusted role: the schema is served at the next
// discovery.
func TestAdvUntrustedSchemaNotServed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := outboxtest.Pool(t)
	prefix := outboxtest.UniqueName(t, "tr")
	good, owned, view := prefix+"_a", prefix+"_b", prefix+"_c"
	migrateSchemas(t, admin, good, owned, view)
	tenant := prefix + "_tenant"
	if _, err := admin.Exec(ctx, "CREATE ROLE "+tenant+" NOLOGIN NOSUPERUSER"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, q := range []string{"REASSIGN OWNED BY " + tenant + " TO CURRENT_USER", "DROP OWNED BY " + tenant, "DROP ROLE " + tenant} {
			if _, err := admin.Exec(context.Background(), q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	for _, q := range []string{
		"ALTER TABLE " + owned + ".outbox_relays OWNER TO " + tenant,
		"ALTER TABLE " + view + ".outbox_relays RENAME TO outbox_relays_t",
		"CREATE VIEW " + view + ".outbox_relays AS SELECT * FROM " + view + ".outbox_relays_t",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	st := newStream(t)
	cfg, err := outboxfleet.Parse(fmt.Appendf(nil, `
relay: {poll_interval: 50ms, discover_interval: 200ms, idle_max: 2s}
databases:
  db: {url: %q, max_conns: 4}
destinations:
  events: {url: "nats://unused"}
sources:
  - {database: db, schema_pattern: "%s_*", destination: events}
`, outboxtest.DatabaseURL(), prefix))
	if err != nil {
		t.Fatal(err)
	}
	f := runFleet(t, cfg, outboxfleet.Options{OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub})})
	state := func(schema string) (string, error) {
		for _, s := range f.Sources() {
			if s.Schema == schema {
				return s.State, s.Ready
			}
		}
		return "", nil
	}
	waitFor(t, 30*time.Second, "the trusted schema running, the others untrusted", func() bool {
		a, _ := state(good)
		b, _ := state(owned)
		c, _ := state(view)
		return a == "running" && b == "untrusted" && c == "untrusted"
	})
	var w written
	w.write(t, admin, good, "order", 1, 1)
	waitFor(t, 30*time.Second, "the trusted schema's event published", func() bool { return st.count(t) == 1 })
	_, errB := state(owned)
	if errB == nil || !strings.Contains(errB.Error(), "outbox_relays") || !strings.Contains(errB.Error(), tenant) {
		t.Errorf("untrusted %s: %v; want the table and its owner %s named", owned, errB, tenant)
	}
	_, errC := state(view)
	if errC == nil || !strings.Contains(errC.Error(), "outbox_relays") || !strings.Contains(errC.Error(), "not a table") {
		t.Errorf("untrusted %s: %v; want the view named as not a table", view, errC)
	}
	if err := f.Ready(); err == nil || !strings.Contains(err.Error(), owned) || !strings.Contains(err.Error(), view) {
		t.Errorf("Ready() = %v; want it to name %s and %s", err, owned, view)
	}
	if running(f)[owned] || running(f)[view] {
		t.Errorf("an untrusted schema is running: %v", running(f))
	}
	if _, err := admin.Exec(ctx, "ALTER TABLE "+owned+".outbox_relays OWNER TO CURRENT_USER"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the schema handed back served", func() bool { return running(f)[owned] })
}

// TestFleetRunningSourceLosesTrust: a running source whose outbox_events is
// handed to a tenant role, and later (trusted again and running) gains a
// trigger whose function the tenant owns, is stopped at the next discovery
// each time: state "untrusted" naming the object, Ready naming it, logged
// once per finding, while the other source keeps publishing. Before the
// fleet re-checked running sources, it kept serving them.
func TestFleetRunningSourceLosesTrust(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := outboxtest.Pool(t)
	prefix := outboxtest.UniqueName(t, "tl")
	a, b, c := prefix+"_a", prefix+"_b", prefix+"_c"
	migrateSchemas(t, admin, a, b)
	tenant := prefix + "_tenant"
	exec := func(qs ...string) {
		t.Helper()
		for _, q := range qs {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	exec("CREATE ROLE " + tenant + " NOLOGIN NOSUPERUSER")
	t.Cleanup(func() {
		for _, q := range []string{"REASSIGN OWNED BY " + tenant + " TO CURRENT_USER", "DROP OWNED BY " + tenant, "DROP ROLE " + tenant} {
			if _, err := admin.Exec(context.Background(), q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	st := newStream(t)
	cfg, err := outboxfleet.Parse(fmt.Appendf(nil, `
relay: {poll_interval: 50ms, discover_interval: 200ms, idle_max: 2s}
databases:
  db: {url: %q, max_conns: 4}
destinations:
  events: {url: "nats://unused"}
sources:
  - {database: db, schema_pattern: "%s_*", destination: events}
`, outboxtest.DatabaseURL(), prefix))
	if err != nil {
		t.Fatal(err)
	}
	logs := &outboxtest.Buffer{}
	f := runFleet(t, cfg, outboxfleet.Options{OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub}),
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	state := func(schema string) (string, error) {
		for _, s := range f.Sources() {
			if s.Schema == schema {
				return s.State, s.Ready
			}
		}
		return "", nil
	}
	untrusted := func(what, object string) {
		t.Helper()
		waitFor(t, 30*time.Second, a+" stopped as untrusted after "+what, func() bool {
			s, _ := state(a)
			return s == "untrusted"
		})
		if _, why := state(a); why == nil || !strings.Contains(why.Error(), object) || !strings.Contains(why.Error(), tenant) {
			t.Errorf("untrusted %s after %s: %v; want %s and its owner %s named", a, what, why, object, tenant)
		}
		if err := f.Ready(); err == nil || !strings.Contains(err.Error(), a) {
			t.Errorf("Ready() = %v; want it to name %s", err, a)
		}
		if running(f)[a] {
			t.Errorf("%s is running after %s", a, what)
		}
	}
	var w written
	published := 0
	publishB := func(why string) { // the other source is served all along
		t.Helper()
		w.write(t, admin, b, "order", 1, 1)
		published++
		waitFor(t, 30*time.Second, "the other source's event published "+why, func() bool { return st.count(t) == uint64(published) })
	}
	waitFor(t, 30*time.Second, "both sources running", func() bool { return running(f)[a] && running(f)[b] })
	w.write(t, admin, a, "order", 1, 1)
	published++
	waitFor(t, 30*time.Second, "the first event published", func() bool { return st.count(t) == uint64(published) })

	exec("ALTER TABLE " + a + ".outbox_events OWNER TO " + tenant)
	untrusted("its outbox_events was handed to a tenant", "outbox_events")
	publishB("while the first is untrusted")

	exec("ALTER TABLE " + a + ".outbox_events OWNER TO CURRENT_USER")
	waitFor(t, 30*time.Second, a+" served again once trusted", func() bool { return running(f)[a] })
	exec("CREATE FUNCTION "+a+".hook() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$",
		"ALTER FUNCTION "+a+".hook() OWNER TO "+tenant,
		"CREATE TRIGGER hook AFTER INSERT ON "+a+".outbox_operations FOR EACH ROW EXECUTE FUNCTION "+a+".hook()")
	untrusted("a trigger of the tenant's function was added", "trigger hook")
	publishB("while the first has an untrusted trigger")

	// A schema that appears after the finding is started by a later
	// discovery: the finding was not logged again meanwhile.
	migrateSchemas(t, admin, c)
	waitFor(t, 30*time.Second, "a new schema served by a later discovery", func() bool { return running(f)[c] })
	if got := strings.Count(logs.String(), "source no longer trusted"); got != 2 {
		t.Errorf("%d log lines on a running source no longer trusted, want 2 (one per finding):\n%s", got, logs.String())
	}
	if got := strings.Count(logs.String(), `msg="schema not served`); got != 0 {
		t.Errorf("%d log lines on a schema not served, want 0 (the finding was logged when the source stopped):\n%s", got, logs.String())
	}
}
