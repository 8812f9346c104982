package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/internal/redact"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// requireLatestSchema refuses a schema that is missing or behind this binary's
// migrations, with the command that fixes it.
func requireLatestSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	v, err := outboxmigrate.Version(ctx, pool, schema)
	if err != nil {
		return fmt.Errorf("read schema version of %s: %w", schema, err)
	}
	all := outboxmigrate.All()
	latest := all[len(all)-1].Version
	switch {
	case v == 0:
		if c, err := outboxmigrate.VersionComponents(ctx, pool, schema, outboxmigrate.ComponentsConsumer); err == nil && c > 0 {
			return fmt.Errorf("schema %s holds the consumer side only ('outbox migrate --only consumer'), no outbox tables: 'outbox inbox status' and 'outbox sideeffect parked' read it; 'outbox migrate --schema %s' adds the outbox side", schema, schema)
		}
		return fmt.Errorf("schema %s has no outbox tables: run 'outbox migrate --schema %s' first", schema, schema)
	case v < latest:
		return fmt.Errorf("schema %s is at migration version %d, this binary needs %d: run 'outbox migrate --schema %s'", schema, v, latest, schema)
	}
	return nil
}

// requireConsumerSchema is requireLatestSchema for the consumer side's
// commands: it also accepts a schema holding only the consumer side
// (`outbox migrate --only consumer`), at this binary's latest consumer step.
func requireConsumerSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	full := requireLatestSchema(ctx, pool, schema)
	if full == nil {
		return nil
	}
	v, err := outboxmigrate.VersionComponents(ctx, pool, schema, outboxmigrate.ComponentsConsumer)
	if err != nil {
		return fmt.Errorf("read consumer schema version of %s: %w", schema, err)
	}
	steps := outboxmigrate.ConsumerMigrations()
	switch latest := steps[len(steps)-1].Version; {
	case v == 0:
		return full
	case v < latest:
		return fmt.Errorf("schema %s holds the consumer side at version %d, this binary needs %d: run 'outbox migrate --only consumer --schema %s'", schema, v, latest, schema)
	}
	return nil
}

// openAdmin connects, checks the schema and returns an Admin; close the
// pool when done.
func openAdmin(ctx context.Context, common cli.Common, obs outbox.CleanupObserver) (*outbox.Admin, *pgxpool.Pool, error) {
	pool, err := common.Connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := requireLatestSchema(ctx, pool, common.Schema); err != nil {
		pool.Close()
		return nil, nil, err
	}
	admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: common.Schema, Observer: obs})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return admin, pool, nil
}

func opJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// opAge formats a duration for people: 0s, 850ms, 42s, 5m03s, 3h12m, 4d03h.
func opAge(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

func opSeconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// opBytes formats a size: 8.0 KiB, 1.5 GiB.
func opBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// opCount formats a row estimate: 950, 12.3k, 4.1M.
func opCount(n int64) string {
	switch {
	case n < 0:
		return "?"
	case n < 10_000:
		return fmt.Sprint(n)
	case n < 1_000_000:
		return fmt.Sprintf("%.1fk", float64(n)/1e3)
	}
	return fmt.Sprintf("%.1fM", float64(n)/1e6)
}

func opOneLine(s string, n int) string {
	// A webhook URL in a last error recorded by an older version keeps its
	// path (which can be the endpoint's token): shown without it.
	s = strings.Join(strings.Fields(redact.Text(s)), " ")
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}
