package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxcdc"
	"github.com/pgoutbox/outbox/outboxconsole"
	"github.com/pgoutbox/outbox/outboxprom"
	"github.com/pgoutbox/outbox/sideeffect"
)

// TestOneSchemaValueForEveryConfig: the one outbox.Schema value, in each
// config's Tables field, is the schema the component works on; the same
// name in the older Schema field too is fine; two different names are
// refused by every constructor with ErrSchemaConflict, and a bad name too.
func TestOneSchemaValueForEveryConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, name := outboxtest.Schema(t)
	schema := outbox.Schema(name)

	// Tables alone: an event written through it is in that schema, and an
	// Admin built with it, or with both fields equal, sees it.
	w, err := outbox.NewWriter(outbox.WriterConfig{Tables: schema})
	if err != nil {
		t.Fatal(err)
	}
	var recs []outbox.Recorded
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		recs, err = w.InsertTx(ctx, tx, orderEvent("s-1", "Placed"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []outbox.AdminConfig{{Tables: schema}, {Tables: schema, Schema: name}} {
		admin, err := outbox.NewAdmin(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if e, err := admin.Event(ctx, recs[0].ID); err != nil || e.AggregateID != "s-1" || admin.Schema() != name {
			t.Fatalf("Admin %+v: event %+v, %v, schema %s; want the event written through Tables", cfg, e, err, admin.Schema())
		}
	}
	if schema.Name() != name || outbox.Schema("").Name() != "outbox" {
		t.Fatalf("Name() = %q and %q", schema.Name(), outbox.Schema("").Name())
	}

	other := "not_" + name
	pub := outbox.PublisherFunc(func(context.Context, []outbox.Message) []error { return nil })
	constructors := map[string]func(tables outbox.Schema, legacy string) error{
		"WriterConfig": func(tb outbox.Schema, s string) error {
			_, err := outbox.NewWriter(outbox.WriterConfig{Tables: tb, Schema: s})
			return err
		},
		"RelayConfig": func(tb outbox.Schema, s string) error {
			_, err := outbox.NewRelay(pool, outbox.RelayConfig{Tables: tb, Schema: s, Publisher: pub})
			return err
		},
		"NotifierConfig": func(tb outbox.Schema, s string) error {
			n, err := outbox.NewNotifier(pool, outbox.NotifierConfig{Tables: tb, Schema: s})
			if err == nil {
				n.Close()
			}
			return err
		},
		"AdminConfig": func(tb outbox.Schema, s string) error {
			_, err := outbox.NewAdmin(pool, outbox.AdminConfig{Tables: tb, Schema: s})
			return err
		},
		"inbox.Config": func(tb outbox.Schema, s string) error {
			_, err := inbox.New(pool, inbox.Config{Consumer: "c", Tables: tb, Schema: s})
			return err
		},
		"inbox.AdminConfig": func(tb outbox.Schema, s string) error {
			_, err := inbox.NewAdmin(pool, inbox.AdminConfig{Tables: tb, Schema: s})
			return err
		},
		"sideeffect.Config": func(tb outbox.Schema, s string) error {
			_, err := sideeffect.New(pool, sideeffect.Config{Name: "x.y", Mode: sideeffect.Idempotent, Tables: tb, Schema: s})
			return err
		},
		"sideeffect.AdminConfig": func(tb outbox.Schema, s string) error {
			_, err := sideeffect.NewAdmin(pool, sideeffect.AdminConfig{Tables: tb, Schema: s})
			return err
		},
		"outboxcdc.Config": func(tb outbox.Schema, s string) error {
			return outboxcdc.Setup(ctx, outboxcdc.Config{Pool: pool, Tables: tb, Schema: s, Slot: "never_created", Publication: "never_created"})
		},
		"outboxprom.Config": func(tb outbox.Schema, s string) error {
			_, err := outboxprom.New(outboxprom.Config{Tables: tb, Schema: s})
			return err
		},
		"outboxconsole.Config": func(tb outbox.Schema, s string) error {
			_, err := outboxconsole.New(outboxconsole.Config{Pool: pool, Tables: tb, Schema: s})
			return err
		},
	}
	for what, build := range constructors {
		if err := build(schema, other); !errors.Is(err, outbox.ErrSchemaConflict) {
			t.Errorf("%s with Tables %q and Schema %q: %v, want ErrSchemaConflict", what, schema, other, err)
		}
		if what == "outboxcdc.Config" {
			continue // Setup goes on to the server when the names are fine
		}
		if err := build(schema, name); err != nil {
			t.Errorf("%s with Tables and Schema both %q: %v", what, name, err)
		}
		if what == "outboxprom.Config" {
			continue // the schema is only a label there
		}
		if err := build("bad name", ""); err == nil {
			t.Errorf("%s accepted Tables %q", what, "bad name")
		}
	}
	if err := outbox.Schema("bad name").Validate(); err == nil || outbox.Schema("").Validate() != nil {
		t.Fatal("Validate: a bad name accepted, or the unset Schema refused")
	}
}
