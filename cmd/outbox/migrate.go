package main

import (
	"context"
	"fmt"
	"os"

	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

const migrateUsage = `migrate [--database-url URL] [--schema NAME] [--only consumer] [--partitioned [--partition-interval 1h] [--partitions-ahead 6]] [--status [--json] | --print | --print-grants [--writer-role R] [--relay-role R] [--operator-role R] [--consumer-role R]]

Creates the schema's outbox tables or applies the migrations it lacks (idempotent; safe from
several processes at once). --only consumer installs (or, with --print, prints) only the
consumer side, for a consumer's own database: the inbox, side-effect and audit-log tables and
the SQL inbox functions, no outbox_events; a later migrate without it adds the rest. --status only reads: the version the schema is at, the migrations
applied (with when) and the ones this binary would apply; with --json as one JSON object
(schema, components, version, latest_version, up_to_date, ahead, applied[{version, name,
applied_at}], pending[{version, name}]); on a consumer-only schema (components "consumer") the
versions are the consumer install's. --print and --print-grants print SQL and touch no database.

--partitioned then makes outbox_events a table partitioned by RANGE (event_id), one partition per
--partition-interval of the time the UUIDv7 ids hold, with --partitions-ahead partitions ready
ahead; the relay's upkeep creates the next ones and drops the settled ones past the replay horizon
(--cleanup-older-than) instead of deleting rows. An empty table is replaced; a table with events
keeps them as its first partition, after a range check validated online; ids that are not
time-ordered UUIDv7s (UUIDv4s supplied by the application) are refused. Run it as the tables'
owner. See docs/operations.md, "Partitioned outbox".`

func runMigrate(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "migrate", migrateUsage)
	var common cli.Common
	common.Register(fs)
	only := fs.String("only", "", "install only this component: consumer (the inbox, side effects and audit log, for a consumer's own database)")
	print := fs.Bool("print", false, "print the SQL for the schema instead of applying it (for your own migration tool)")
	status := fs.Bool("status", false, "only show the schema's version, the migrations applied and those this binary would apply; changes nothing")
	asJSON := fs.Bool("json", false, "with --status: print it as JSON")
	printGrants := fs.Bool("print-grants", false, "print the GRANT statements that give the writer, relay, operator and consumer roles least privilege on the schema (run them as the tables' owner; see docs/operations.md, Security, Roles)")
	var roles outboxmigrate.Roles
	fs.StringVar(&roles.Writer, "writer-role", outboxmigrate.WriterRoleDefault, "with --print-grants: the application's role (Writer, Notifier)")
	fs.StringVar(&roles.Relay, "relay-role", outboxmigrate.RelayRoleDefault, "with --print-grants: the relay's role")
	fs.StringVar(&roles.Operator, "operator-role", outboxmigrate.OperatorRoleDefault, "with --print-grants: the role of outbox status, quarantine, replay, cleanup and inbox")
	fs.StringVar(&roles.Consumer, "consumer-role", outboxmigrate.ConsumerRoleDefault, "with --print-grants: the role of a consumer's inbox (inbox.Inbox)")
	partitioned := fs.Bool("partitioned", false, "make outbox_events partitioned by the time of its UUIDv7 ids, the settled partitions dropped instead of rows deleted (docs/operations.md, Partitioned outbox)")
	var interval cli.Duration
	interval.D = outboxmigrate.PartitionIntervalDefault
	fs.Var(&interval, "partition-interval", "with --partitioned: the width of a partition, whole seconds (`DURATION`)")
	ahead := fs.Int("partitions-ahead", outboxmigrate.PartitionAheadDefault, "with --partitioned: partitions created ahead of the current one")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *partitioned && (*status || *print || *printGrants || *only != "") {
		return cli.Usagef(fs, "--partitioned goes with a migrate, not with --status, --print, --print-grants or --only")
	}
	if *print && *printGrants || *status && (*print || *printGrants) {
		return cli.Usagef(fs, "--status, --print and --print-grants are exclusive")
	}
	if *asJSON && !*status {
		return cli.Usagef(fs, "--json goes with --status")
	}
	components := outboxmigrate.ComponentsAll
	if *only != "" {
		if *only != string(outboxmigrate.ComponentsConsumer) {
			return cli.Usagef(fs, "--only takes %q, not %q", outboxmigrate.ComponentsConsumer, *only)
		}
		if *status || *printGrants {
			return cli.Usagef(fs, "--only goes with a migrate or --print, not with --status or --print-grants")
		}
		components = outboxmigrate.ComponentsConsumer
	}
	if *printGrants {
		text, err := outboxmigrate.Grants(common.Schema, roles)
		if err != nil {
			return err
		}
		fmt.Print(text)
		return nil
	}
	if *print {
		text, err := outboxmigrate.SQLComponents(common.Schema, components)
		if err != nil {
			return err
		}
		fmt.Print(text)
		return nil
	}
	pool, err := common.Connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if *status {
		st, err := readMigrationStatus(ctx, pool, common.Schema)
		if err != nil {
			return err
		}
		if *asJSON {
			return opJSON(os.Stdout, st)
		}
		printMigrationStatus(os.Stdout, st)
		return nil
	}
	res, err := outboxmigrate.MigrateComponents(ctx, pool, common.Schema, components)
	if err != nil {
		return err
	}
	if components == outboxmigrate.ComponentsConsumer {
		if len(res.Applied) == 0 {
			fmt.Printf("schema %s: the consumer side is up to date (consumer version %d)\n", common.Schema, res.Current)
		} else {
			fmt.Printf("schema %s: the consumer side migrated to consumer version %d (applied %v)\n", common.Schema, res.Current, res.Applied)
		}
		return nil
	}
	if len(res.Applied) == 0 {
		fmt.Printf("schema %s is up to date (version %d)\n", common.Schema, res.Current)
	} else {
		fmt.Printf("schema %s migrated to version %d (applied %v)\n", common.Schema, res.Current, res.Applied)
	}
	if *partitioned {
		p, err := outboxmigrate.Partition(ctx, pool, common.Schema, outboxmigrate.PartitionConfig{Interval: interval.D, Ahead: *ahead})
		if err != nil {
			return err
		}
		switch {
		case !p.Converted:
			fmt.Printf("schema %s: outbox_events is partitioned already (%d partitions created ahead)\n", common.Schema, len(p.Created))
		case p.Kept != "":
			fmt.Printf("schema %s: outbox_events partitioned; its events are partition %s, %d partitions created ahead\n", common.Schema, p.Kept, len(p.Created))
		default:
			fmt.Printf("schema %s: outbox_events partitioned, %d partitions created\n", common.Schema, len(p.Created))
		}
	}
	return nil
}
