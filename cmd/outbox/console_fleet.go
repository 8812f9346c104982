package main

// `outbox console --config relay.yaml`: one console for every source of a
// fleet (package outboxfleet), behind one login (outboxconsole.NewMulti).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/internal/destination"
	"github.com/pgoutbox/outbox/internal/redact"
	"github.com/pgoutbox/outbox/outboxconsole"
	"github.com/pgoutbox/outbox/outboxfleet"
)

// consoleFleetRefused are the console's flags that name one source, which
// the file replaces, and the destination's (replay is offered for one
// schema only).
var consoleFleetRefused = func() map[string]bool {
	m := map[string]bool{"database-url": true, "schema": true, "inbox-schema": true, "sideeffect-schema": true}
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	var dest destination.Options
	dest.Register(fs)
	fs.VisitAll(func(f *flag.Flag) { m[f.Name] = true })
	return m
}()

// checkConsoleFleetFlags refuses, beside --config, a flag given on the
// command line that names one source.
func checkConsoleFleetFlags(fs *flag.FlagSet) error {
	var bad []string
	fs.Visit(func(f *flag.Flag) {
		if consoleFleetRefused[f.Name] {
			bad = append(bad, "--"+f.Name)
		}
	})
	if len(bad) > 0 {
		sort.Strings(bad)
		return cli.Usagef(fs, "%s: not with --config (the file lists the databases and schemas; replay is not offered for a fleet)", strings.Join(bad, ", "))
	}
	return nil
}

// consoleFleetMaxConnsDefault is the console's pool size per database of a
// fleet (--fleet-max-conns).
const consoleFleetMaxConnsDefault = 4

// consoleListTimeout bounds listing one database's schemas for the index.
const consoleListTimeout = 5 * time.Second

// fleetConsole is what the console of a fleet reads: one pool per
// database, of --fleet-max-conns connections, shared by its sources.
type fleetConsole struct {
	cfg   outboxfleet.Config
	names []string
	pools map[string]*pgxpool.Pool
	errs  map[string]error // a database whose URL could not be read
}

// openFleetConsole makes the pools; none connects before a page is asked.
func openFleetConsole(ctx context.Context, file string, maxConns int32) (*fleetConsole, error) {
	cfg, err := outboxfleet.Load(file)
	if err != nil {
		return nil, err
	}
	fc := &fleetConsole{cfg: cfg, pools: map[string]*pgxpool.Pool{}, errs: map[string]error{}}
	for name, db := range cfg.Databases {
		fc.names = append(fc.names, name)
		pc, err := pgxpool.ParseConfig(db.URL)
		if err != nil {
			fc.errs[name] = redact.Error(fmt.Errorf("url: %w", err), redact.DatabaseSecrets(db.URL)...)
			continue
		}
		pc.MaxConns = maxConns
		pc.MinConns = 0
		if _, ok := pc.ConnConfig.RuntimeParams["application_name"]; !ok {
			pc.ConnConfig.RuntimeParams["application_name"] = "outbox console (fleet)"
		}
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			fc.errs[name] = redact.Error(err, redact.DatabaseSecrets(db.URL)...)
			continue
		}
		fc.pools[name] = pool
	}
	sort.Strings(fc.names)
	return fc, nil
}

func (fc *fleetConsole) Close() {
	for _, p := range fc.pools {
		p.Close()
	}
}

// sources lists every database's schemas now (concurrently, each within
// consoleListTimeout) and matches them against the file's sources, as the
// relay does (outboxfleet.ListSchemas, Config.Match): a pattern's schemas
// are those present now. A database that cannot be listed is one down
// source, its error without the URL's secrets.
func (fc *fleetConsole) sources(ctx context.Context) []outboxconsole.Source {
	per := make([][]outboxconsole.Source, len(fc.names))
	var wg sync.WaitGroup
	for i, name := range fc.names {
		if err := fc.errs[name]; err != nil {
			per[i] = []outboxconsole.Source{{Database: name, Err: err}}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pool := fc.pools[name]
			cctx, cancel := context.WithTimeout(ctx, consoleListTimeout)
			defer cancel()
			present, err := outboxfleet.ListSchemas(cctx, pool)
			if err != nil {
				if cctx.Err() != nil && ctx.Err() == nil {
					err = fmt.Errorf("no answer within %s: %w", consoleListTimeout, err)
				}
				per[i] = []outboxconsole.Source{{Database: name, Err: redact.Error(err, redact.DatabaseSecrets(fc.cfg.Databases[name].URL)...)}}
				return
			}
			serve, missing := fc.cfg.Match(name, present)
			var out []outboxconsole.Source
			for _, s := range serve {
				out = append(out, outboxconsole.Source{Database: name, Schema: s, Pool: pool, TrustedOwners: fc.cfg.Databases[name].TrustedOwners})
			}
			for _, s := range missing {
				out = append(out, outboxconsole.Source{Database: name, Schema: s,
					Err: errors.New("no outbox tables: run 'outbox migrate --schema " + s + "'")})
			}
			per[i] = out
		}()
	}
	wg.Wait()
	var all []outboxconsole.Source
	for _, p := range per {
		all = append(all, p...)
	}
	return all
}

// logFleetConsole names the databases and sources served.
func logFleetConsole(log *slog.Logger, file string, fc *fleetConsole) {
	log.Info("fleet configuration", slog.String("file", file), slog.String("databases", strings.Join(fc.names, ",")),
		slog.Int("sources", len(fc.cfg.Sources)))
}
