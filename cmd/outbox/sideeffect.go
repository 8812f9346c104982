package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/sideeffect"
)

const sideEffectUsage = `sideeffect parked|show|resolve [flags]

  parked [--name N]           attempts parked for an operator, oldest first, with the reason
  show --name N --key K       one attempt: state, attempts, checks, errors, response
  resolve --name N --key K --as succeeded|failed|retry --reason TEXT
                              settle a parked or unknown attempt as you checked with the provider,
                              or let the next call go ahead with the same key; who and why are recorded

Consumers record their external calls (package sideeffect) in --schema, their
own schema. An attempt whose outcome stayed unknown past its bound is parked:
nothing calls the provider for it until an operator decides. See
docs/side-effects.md. Run 'outbox sideeffect <parked|show|resolve> --help'
for each one's flags.`

func runSideEffect(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "sideeffect", sideEffectUsage)
	return cli.Dispatch(ctx, fs, args, []cli.Command{
		{Name: "parked", Run: sideEffectParked},
		{Name: "show", Run: sideEffectShow},
		{Name: "resolve", Run: sideEffectResolve},
	})
}

// openSideEffectAdmin connects and checks that the schema has the
// side_effects table; close the pool when done.
func openSideEffectAdmin(ctx context.Context, common cli.Common) (*sideeffect.Admin, *pgxpool.Pool, error) {
	pool, err := common.Connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	admin, err := sideeffect.NewAdmin(pool, sideeffect.AdminConfig{Schema: common.Schema})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	ok, err := admin.Exists(ctx)
	if err == nil && !ok {
		err = fmt.Errorf("schema %s has no side-effect table: run 'outbox migrate --schema %s' first", common.Schema, common.Schema)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return admin, pool, nil
}

func sideEffectParked(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "sideeffect parked", `sideeffect parked [--name N] [--limit N] [--json] [flags]

Lists the attempts parked for an operator, oldest park first (at most --limit): name, key,
attempts and lookups made, why it was parked, the last error.`)
	var common cli.Common
	common.Register(fs)
	name := fs.String("name", "", "only this name (the Caller's Config.Name)")
	limit := fs.Int("limit", 100, "most attempts listed")
	asJSON := fs.Bool("json", false, "print the page as JSON")
	err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if *limit < 1 {
		return cli.Usagef(fs, "--limit %d must be positive", *limit)
	}
	admin, pool, err := openSideEffectAdmin(ctx, common)
	if err != nil {
		return err
	}
	defer pool.Close()
	page, err := admin.Parked(ctx, sideeffect.ParkedFilter{Name: *name, Limit: *limit})
	if err != nil {
		return err
	}
	if *asJSON {
		if page.Attempts == nil {
			page.Attempts = []sideeffect.Attempt{}
		}
		return opJSON(os.Stdout, page)
	}
	if len(page.Attempts) == 0 {
		fmt.Println("no parked attempts")
		return nil
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PARKED SINCE\tNAME\tKEY\tATTEMPTS\tCHECKS\tREASON\tLAST ERROR")
	for _, a := range page.Attempts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", a.ParkedAt.Format(time.RFC3339), a.Name, a.Key, a.Attempts, a.Checks,
			opOneLine(a.ParkReason, 80), opOneLine(a.LastError, 60))
	}
	tw.Flush()
	if page.Next != nil {
		fmt.Printf("(oldest %d shown; use --limit)\n", len(page.Attempts))
	}
	return nil
}

func sideEffectShow(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "sideeffect show", `sideeffect show --name N --key K [--json] [flags]

Shows one attempt as recorded: its state, the provider mode, attempts, lookups and blind retries,
timestamps, the last error, the response, why it was parked and the last operator action; and the
consumers' events waiting on it (sideeffect.Caller.WaitTx), which resolving it wakes (in --json,
"waiting").`)
	var common cli.Common
	common.Register(fs)
	name := fs.String("name", "", "the name (required)")
	key := fs.String("key", "", "the idempotency key (required)")
	asJSON := fs.Bool("json", false, "print the attempt as JSON")
	err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case *name == "" || *key == "":
		return cli.Usagef(fs, "--name and --key are required")
	}
	admin, pool, err := openSideEffectAdmin(ctx, common)
	if err != nil {
		return err
	}
	defer pool.Close()
	a, err := admin.Attempt(ctx, *name, *key)
	if err != nil {
		return err
	}
	waiting, err := admin.Waiting(ctx, *name, *key)
	if err != nil {
		return err
	}
	if *asJSON {
		return opJSON(os.Stdout, struct {
			sideeffect.Attempt
			Waiting []sideeffect.WaitingEvent `json:"waiting"`
		}{a, waiting})
	}
	printAttempt(a, waiting...)
	return nil
}

func printAttempt(a sideeffect.Attempt, waiting ...sideeffect.WaitingEvent) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	state := string(a.State)
	if a.Expired {
		state += " (lease expired: counts as unknown)"
	}
	fmt.Fprintf(tw, "attempt\t%s %s\n", a.Name, a.Key)
	fmt.Fprintf(tw, "state\t%s (mode %s)\n", state, a.Mode)
	fmt.Fprintf(tw, "calls\t%d (blind retries %d), lookups %d\n", a.Attempts, a.BlindRetries, a.Checks)
	fmt.Fprintf(tw, "created\t%s\n", a.CreatedAt.Format(time.RFC3339))
	if a.UnknownSince != nil {
		fmt.Fprintf(tw, "unknown since\t%s\n", a.UnknownSince.Format(time.RFC3339))
	}
	if a.NextCheck != nil {
		fmt.Fprintf(tw, "next check\t%s\n", a.NextCheck.Format(time.RFC3339))
	}
	if a.Via != "" {
		fmt.Fprintf(tw, "resolved by\t%s\n", a.Via)
	}
	if a.LastError != "" {
		fmt.Fprintf(tw, "last error\t%s\n", opOneLine(a.LastError, 200))
	}
	if a.ParkedAt != nil {
		fmt.Fprintf(tw, "parked\t%s: %s\n", a.ParkedAt.Format(time.RFC3339), a.ParkReason)
	}
	if a.Operator != nil {
		fmt.Fprintf(tw, "operator\t%s by %s: %s\n", a.Operator.At.Format(time.RFC3339), a.Operator.By, a.Operator.Reason)
	}
	if len(a.Response) > 0 {
		fmt.Fprintf(tw, "response\t%s\n", opOneLine(string(a.Response), 200))
	}
	fmt.Fprintf(tw, "fingerprint\tsha256:%s\n", a.Fingerprint)
	for _, w := range waiting {
		fmt.Fprintf(tw, "waiting\tconsumer %s: event %s (%s, %s %s #%d) since %s", w.Consumer, w.EventID, w.EventType,
			w.AggregateType, w.AggregateID, w.Sequence, w.Since.Format(time.RFC3339))
		if w.LastError != "" {
			fmt.Fprintf(tw, ", %d runs, last error: %s", w.Wakes, opOneLine(w.LastError, 120))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

func sideEffectResolve(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "sideeffect resolve", `sideeffect resolve --name N --key K --as succeeded|failed|retry --reason TEXT [--response BODY] [--by NAME] [--json] [flags]

Settles a parked or unknown attempt (or one whose caller died) as an operator decided:
  succeeded   the effect happened (you checked with the provider); --response is recorded
  failed      it did not happen and must not be tried again
  retry       let the consumer's next call go ahead with the same key; in provider mode neither
              that call may duplicate the effect (it is counted as a blind retry)
The consumer's next Do for the key then returns that outcome, or calls. Who, when and why are
recorded on the attempt and in the audit log.`)
	var common cli.Common
	common.Register(fs)
	var r sideeffect.Resolution
	fs.StringVar(&r.Name, "name", "", "the name (required)")
	fs.StringVar(&r.Key, "key", "", "the idempotency key (required)")
	as := fs.String("as", "", "succeeded, failed or retry (required)")
	response := fs.String("response", "", "the provider's response to record (succeeded, failed)")
	fs.StringVar(&r.Reason, "reason", "", "why, recorded (required)")
	fs.StringVar(&r.By, "by", cli.CurrentUser(), "who resolves, recorded")
	asJSON := fs.Bool("json", false, "print the attempt as resolved, as JSON")
	err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	r.As = sideeffect.ResolveAs(*as)
	switch {
	case r.Name == "" || r.Key == "":
		return cli.Usagef(fs, "--name and --key are required")
	case r.As != sideeffect.ResolveSucceeded && r.As != sideeffect.ResolveFailed && r.As != sideeffect.ResolveRetry:
		return cli.Usagef(fs, "--as must be succeeded, failed or retry")
	case *response != "" && r.As == sideeffect.ResolveRetry:
		return cli.Usagef(fs, "--response goes with --as succeeded or failed")
	case r.Reason == "":
		return cli.Usagef(fs, "--reason is required: say what you checked")
	case r.By == "":
		return cli.Usagef(fs, "--by is empty")
	}
	if *response != "" {
		r.Response = []byte(*response)
	}
	admin, pool, err := openSideEffectAdmin(ctx, common)
	if err != nil {
		return err
	}
	defer pool.Close()
	a, err := admin.Resolve(ctx, r)
	switch {
	case errors.Is(err, sideeffect.ErrNotFound):
		return fmt.Errorf("resolve: no attempt %s %s in schema %s (check --name, --key and --schema)", r.Name, r.Key, admin.Schema())
	case errors.Is(err, sideeffect.ErrFinal):
		return fmt.Errorf("resolve: attempt %s %s is final already; nothing to resolve (%v)", r.Name, r.Key, err)
	case errors.Is(err, sideeffect.ErrInProgress):
		return fmt.Errorf("resolve: attempt %s %s is being handled by a caller right now (a live claim); try again after it ends", r.Name, r.Key)
	case err != nil:
		return err
	}
	if *asJSON {
		return opJSON(os.Stdout, a)
	}
	fmt.Printf("attempt %s %s: %s, resolved by %s at %s\n", a.Name, a.Key, a.State, a.Operator.By, a.Operator.At.Format(time.RFC3339))
	return nil
}
