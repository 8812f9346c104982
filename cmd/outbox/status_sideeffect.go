package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/sideeffect"
)

// The side-effect section of `outbox status`: the consumers' external calls
// (package sideeffect) recorded in a schema of the same database.

// sideEffectParkedShown is how many parked attempts status lists.
const sideEffectParkedShown = 20

// registerSideEffectFlag adds --sideeffect-schema to status.
func registerSideEffectFlag(fs *flag.FlagSet) *string {
	return fs.String("sideeffect-schema", cli.Env("OUTBOX_SIDEEFFECT_SCHEMA", ""),
		"schema of a consumer's side-effect attempts to show (env OUTBOX_SIDEEFFECT_SCHEMA; default: --schema, shown when it has any)")
}

// sideEffectStatus reads the side-effect section: from schema when given
// (an error when it has no side_effects table), else from the outbox's own
// schema when it holds any attempt; nil when there is nothing to show.
func sideEffectStatus(ctx context.Context, pool *pgxpool.Pool, schema, outboxSchema string) (*sideeffect.Status, error) {
	explicit := schema != ""
	if !explicit {
		schema = outboxSchema
	}
	admin, err := sideeffect.NewAdmin(pool, sideeffect.AdminConfig{Schema: schema})
	if err != nil {
		return nil, fmt.Errorf("--sideeffect-schema: %w", err)
	}
	ok, err := admin.Exists(ctx)
	switch {
	case err != nil:
		return nil, fmt.Errorf("side effects in schema %s: %w", schema, err)
	case !ok && explicit:
		return nil, fmt.Errorf("schema %s has no side-effect table: run 'outbox migrate --schema %s' first", schema, schema)
	case !ok:
		return nil, nil
	}
	st, err := admin.Status(ctx, sideEffectParkedShown)
	if err != nil {
		return nil, err
	}
	if len(st.Names) == 0 && !explicit {
		return nil, nil
	}
	return &st, nil
}

// statusWithSideEffects is `outbox status --json`: the outbox's status, with
// a side_effects object when there is one to show.
type statusWithSideEffects struct {
	outbox.Status
	SideEffects *sideeffect.Status `json:"side_effects,omitempty"`
}

func printSideEffects(w io.Writer, st *sideeffect.Status) {
	if st == nil {
		return
	}
	fmt.Fprintf(w, "\nside effects (schema %s)\n", st.Schema)
	if len(st.Names) == 0 {
		fmt.Fprintln(w, "no attempts recorded")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSUCCEEDED\tFAILED\tIN FLIGHT\tUNKNOWN\tOLDEST UNKNOWN\tPARKED\tBLIND RETRIES")
	for _, n := range st.Names {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%d\t%d\n", n.Name, n.Succeeded, n.Failed, n.Started, n.Unknown,
			opAge(opSeconds(n.OldestUnknownAgeSeconds)), n.Parked, n.BlindRetries)
	}
	tw.Flush()
	if len(st.Parked.Attempts) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(tw, "PARKED SINCE\tNAME\tKEY\tATTEMPTS\tCHECKS\tREASON")
	for _, a := range st.Parked.Attempts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", a.ParkedAt.Format(time.RFC3339), a.Name, a.Key, a.Attempts, a.Checks, opOneLine(a.ParkReason, 80))
	}
	tw.Flush()
	if st.Parked.Next != nil {
		fmt.Fprintf(w, "(oldest %d parked shown)\n", len(st.Parked.Attempts))
	}
}
