package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cli"
)

const quarantineUsage = `quarantine list|retry|skip [flags]

  list                        the quarantined events, their last error and what they block
  retry ID                    put a quarantined event back in its lane (attempts reset)
  skip ID --reason TEXT       settle a quarantined event without publishing it, unblocking its
                              aggregate; who, when and why are recorded. Only an aggregate's
                              first unsettled event can be skipped

An event is quarantined when the destination refused it permanently or it
failed --max-attempts times; its aggregate's later events wait behind it.
Run 'outbox quarantine <list|retry|skip> --help' for each one's flags.`

func runQuarantine(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "quarantine", quarantineUsage)
	return cli.Dispatch(ctx, fs, args, []cli.Command{
		{Name: "list", Run: quarantineList},
		{Name: "retry", Run: quarantineRetry},
		{Name: "skip", Run: quarantineSkip},
	})
}

func quarantineList(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "quarantine list", "quarantine list [--aggregate-type T] [--limit N] [--json] [flags]\n\nLists the quarantined events, oldest quarantine first, with their last error and the number of\nlater events of their aggregate blocked behind them.")
	var common cli.Common
	common.Register(fs)
	aggType := fs.String("aggregate-type", "", "only this aggregate type")
	limit := fs.Int("limit", 100, "most events listed")
	asJSON := fs.Bool("json", false, "print the events as JSON")
	err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if *limit < 1 {
		return cli.Usagef(fs, "--limit %d must be positive", *limit)
	}
	admin, pool, err := openAdmin(ctx, common, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	events, err := admin.ListQuarantined(ctx, outbox.QuarantineFilter{AggregateType: *aggType, Limit: *limit})
	if err != nil {
		return err
	}
	if *asJSON {
		if events == nil {
			events = []outbox.EventInfo{}
		}
		return opJSON(os.Stdout, events)
	}
	if len(events) == 0 {
		fmt.Println("no quarantined events")
		return nil
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT ID\tAGGREGATE\tSEQ\tTYPE\tATTEMPTS\tQUARANTINED\tBLOCKED\tLAST ERROR")
	for _, e := range events {
		fmt.Fprintf(tw, "%s\t%s/%s\t%d\t%s\t%d\t%s\t%d\t%s\n", e.ID, e.AggregateType, e.AggregateID, e.Sequence, e.Type,
			e.Attempts, e.QuarantinedAt.Format(time.RFC3339), e.Blocked, opOneLine(e.LastError, 80))
	}
	tw.Flush()
	if len(events) == *limit {
		fmt.Printf("(first %d shown; use --limit)\n", *limit)
	}
	return nil
}

// eventArg parses the single positional event id of retry and skip.
func eventArg(fs *flag.FlagSet, pos []string) (uuid.UUID, error) {
	switch len(pos) {
	case 0:
		return uuid.Nil, cli.Usagef(fs, "missing the event id")
	case 1:
	default:
		return uuid.Nil, cli.Usagef(fs, "unexpected argument %q (one event id at a time)", pos[1])
	}
	id, err := uuid.Parse(pos[0])
	if err != nil {
		return uuid.Nil, cli.Usagef(fs, "invalid event id %q: not a UUID", pos[0])
	}
	return id, nil
}

func quarantineRetry(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "quarantine retry", "quarantine retry ID [--by NAME] [--json] [flags]\n\nPuts a quarantined event back in its aggregate's lane: pending, attempts reset (the last error\nis kept), relays woken. Behind an earlier quarantined event of its aggregate it waits for that\none; otherwise it is due now. Recorded in the audit log with --by.")
	var common cli.Common
	common.Register(fs)
	by := fs.String("by", cli.CurrentUser(), "who retries, recorded in the audit log")
	asJSON := fs.Bool("json", false, "print the event as JSON")
	pos, err := cli.ParseWithArgs(fs, args)
	if err != nil {
		return err
	}
	id, err := eventArg(fs, pos)
	if err != nil {
		return err
	}
	if *by == "" {
		return cli.Usagef(fs, "--by is empty")
	}
	admin, pool, err := openAdmin(ctx, common, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	e, err := admin.Retry(ctx, id, *by)
	if err != nil {
		return quarantineError(ctx, admin, "retry", id, err)
	}
	if *asJSON {
		return opJSON(os.Stdout, e)
	}
	fmt.Printf("event %s (%s/%s #%d, %s) is back in its lane after %d failed attempts; last error: %s\n",
		e.ID, e.AggregateType, e.AggregateID, e.Sequence, e.Type, e.Attempts, opOneLine(e.LastError, 200))
	return nil
}

func quarantineSkip(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "quarantine skip", "quarantine skip ID --reason TEXT [--by NAME] [--json] [flags]\n\nSettles a quarantined event without publishing it, so that its aggregate's later events go out.\nThe event is never published nor replayed; the next event of its aggregate carries\nce-skippedfrom so that consumers' inboxes accept it. Who, when and why are recorded.\nOnly the aggregate's first unsettled event can be skipped: behind an earlier pending or\nquarantined event, skip or retry that one first (the error names it), or wait until it is\npublished; otherwise the events after it would be published before it.")
	var common cli.Common
	common.Register(fs)
	reason := fs.String("reason", "", "why the event is skipped, recorded (required)")
	by := fs.String("by", cli.CurrentUser(), "who skips, recorded on the event and in the audit log")
	asJSON := fs.Bool("json", false, "print the skipped event as JSON")
	pos, err := cli.ParseWithArgs(fs, args)
	if err != nil {
		return err
	}
	id, err := eventArg(fs, pos)
	if err != nil {
		return err
	}
	switch {
	case *reason == "":
		return cli.Usagef(fs, "--reason is required: say why the event is skipped")
	case *by == "":
		return cli.Usagef(fs, "--by is empty")
	}
	admin, pool, err := openAdmin(ctx, common, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	e, err := admin.Skip(ctx, id, *by, *reason)
	if err != nil {
		return quarantineError(ctx, admin, "skip", id, err)
	}
	if *asJSON {
		return opJSON(os.Stdout, e)
	}
	fmt.Printf("event %s (%s/%s #%d, %s) skipped by %s at %s: %s\n", e.ID, e.AggregateType, e.AggregateID, e.Sequence, e.Type,
		e.SkippedBy, e.SkippedAt.Format(time.RFC3339), e.SkipReason)
	return nil
}

// quarantineError says in one line why retry or skip refused the event.
func quarantineError(ctx context.Context, admin *outbox.Admin, op string, id uuid.UUID, err error) error {
	switch {
	case errors.Is(err, outbox.ErrEventNotFound):
		return fmt.Errorf("%s: no event %s in schema %s", op, id, admin.Schema())
	case errors.Is(err, outbox.ErrNotQuarantined):
		if e, eerr := admin.Event(ctx, id); eerr == nil {
			return fmt.Errorf("%s: event %s is not quarantined: it is %s", op, id, e.State())
		}
		return fmt.Errorf("%s: event %s is not quarantined", op, id)
	case errors.Is(err, outbox.ErrNotLaneHead):
		return fmt.Errorf("%s: %w", op, errors.Unwrap(err))
	}
	return err
}
