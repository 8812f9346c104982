package main

// `outbox status --config relay.yaml`: one line per source of a fleet
// (package outboxfleet), read from each database.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/internal/pgtrust"
	"github.com/pgoutbox/outbox/internal/redact"
	"github.com/pgoutbox/outbox/outboxfleet"
)

// fleetSourceStatus is one source's line.
type fleetSourceStatus struct {
	Source   string `json:"source"`
	Database string `json:"database"`
	Schema   string `json:"schema"`
	// State is "served" or "missing" (named in the file, no outbox tables),
	// "unreadable" (the database or the schema could not be read; Error),
	// or "untrusted" (the schema or an outbox table is owned by a role not
	// in the database's trusted_owners, or is not a table; Error names it).
	State       string `json:"state"`
	Error       string `json:"error,omitempty"`
	RelaysAlive int    `json:"relays_alive"`
	outbox.Backlog
}

func runFleetStatus(ctx context.Context, fs *flag.FlagSet, file string, asJSON bool, out io.Writer) error {
	var bad []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "config" && f.Name != "json" {
			bad = append(bad, "--"+f.Name)
		}
	})
	if len(bad) > 0 {
		return cli.Usagef(fs, "%s: not with --config (beside it only --json applies)", strings.Join(bad, ", "))
	}
	cfg, err := outboxfleet.Load(file)
	if err != nil {
		return err
	}
	var rows []fleetSourceStatus
	failed := 0
	names := make([]string, 0, len(cfg.Databases))
	for name := range cfg.Databases {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		got, err := fleetDatabaseStatus(ctx, cfg, name)
		if err != nil {
			failed++
			got = append(got, fleetSourceStatus{Source: name + "/*", Database: name, State: "unreadable",
				Error: redact.Error(err, redact.DatabaseSecrets(cfg.Databases[name].URL)...).Error()})
		}
		rows = append(rows, got...)
	}
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(map[string]any{"sources": rows}); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "SOURCE\tSTATE\tPENDING\tOLDEST\tQUARANTINED\tLEASED\tEXPIRED LEASES\tRELAYS ALIVE")
		for _, r := range rows {
			if r.State != "served" {
				fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t-\t%s\n", r.Source, r.State, r.Error)
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%d\t%d\t%d\n", r.Source, r.State, r.Pending,
				(time.Duration(r.OldestPendingAgeSeconds * float64(time.Second))).Round(time.Second), r.Quarantined, r.Leased, r.ExpiredLeases, r.RelaysAlive)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d databases could not be read", failed, len(names))
	}
	return nil
}

// fleetDatabaseStatus reads every source of one database.
func fleetDatabaseStatus(ctx context.Context, cfg outboxfleet.Config, name string) ([]fleetSourceStatus, error) {
	pc, err := pgxpool.ParseConfig(cfg.Databases[name].URL)
	if err != nil {
		return nil, fmt.Errorf("databases.%s: url: %w", name, err)
	}
	pc.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	present, err := outboxfleet.ListSchemas(cctx, pool)
	if err != nil {
		return nil, fmt.Errorf("database %s: %w", name, err)
	}
	serve, missing := cfg.Match(name, present)
	var out []fleetSourceStatus
	var errs []error
	for _, schema := range serve {
		row := fleetSourceStatus{Source: name + "/" + schema, Database: name, Schema: schema, State: "served"}
		// Its owners first: an untrusted schema is not read beyond the
		// catalogue (its code would run with this role).
		if err := pgtrust.Check(cctx, pool, schema, cfg.Databases[name].TrustedOwners); err != nil {
			row.State, row.Error = "untrusted", err.Error()
			errs = append(errs, err)
			out = append(out, row)
			continue
		}
		admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
		if err == nil {
			var g outbox.Gauges
			g, err = admin.Gauges(cctx)
			row.Backlog, row.RelaysAlive = g.Backlog, g.RelaysAlive
		}
		if err != nil {
			row.State, row.Error = "unreadable", err.Error()
			errs = append(errs, err)
		}
		out = append(out, row)
	}
	for _, schema := range missing {
		out = append(out, fleetSourceStatus{Source: name + "/" + schema, Database: name, Schema: schema, State: "missing",
			Error: "no outbox tables: run 'outbox migrate --schema " + schema + "'"})
	}
	return out, errors.Join(errs...)
}
