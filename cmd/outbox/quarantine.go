package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/internal/redact"
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

const quarantineListUsage = `quarantine list [--aggregate-type T] [--limit N] [--wide] [--json] [flags]

Lists the quarantined events, oldest quarantine first, with their last error and the number of
later events of their aggregate blocked behind them (BLOCKED), one event a line.

By default the table fits 120 columns: EVENT ID, AGGREGATE (type/id#sequence), TYPE, ATTEMPTS,
AGE (since it was quarantined), BLOCKED and LAST ERROR; a long aggregate is cut in its middle and a
long type or error at its end, marked with "…". --wide prints every column whole (the aggregate's
sequence in a column of its own, the quarantine's time in RFC 3339) whatever the width; --json
prints the events as a JSON array (event_id, aggregate_type, aggregate_id, aggregate_sequence,
event_type, attempt_count, last_error, quarantined_at, blocked, ...).`

func quarantineList(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "quarantine list", quarantineListUsage)
	var common cli.Common
	common.Register(fs)
	aggType := fs.String("aggregate-type", "", "only this aggregate type")
	limit := fs.Int("limit", 100, "most events listed")
	wide := fs.Bool("wide", false, "print every column whole, however wide (default: fit 120 columns, eliding long cells with …)")
	asJSON := fs.Bool("json", false, "print the events as a JSON array")
	err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if *limit < 1 {
		return cli.Usagef(fs, "--limit %d must be positive", *limit)
	}
	if *wide && *asJSON {
		return cli.Usagef(fs, "--wide and --json are exclusive")
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
	writeQuarantined(os.Stdout, events, time.Now(), *wide)
	if len(events) == *limit {
		fmt.Printf("(first %d shown; use --limit)\n", *limit)
	}
	return nil
}

// writeQuarantined prints the quarantine list's table: within
// defaultWidth columns, or whole with wide.
func writeQuarantined(w io.Writer, events []outbox.EventInfo, now time.Time, wide bool) {
	rows := make([][]string, 0, len(events))
	if wide {
		for _, e := range events {
			rows = append(rows, []string{e.ID.String(), e.AggregateType + "/" + e.AggregateID, fmt.Sprint(e.Sequence), e.Type,
				fmt.Sprint(e.Attempts), quarantinedAt(e).Format(time.RFC3339), fmt.Sprint(e.Blocked), redact.Text(e.LastError)})
		}
		writeFitted(w, 0, []fitColumn{{header: "EVENT ID"}, {header: "AGGREGATE"}, {header: "SEQ"}, {header: "TYPE"},
			{header: "ATTEMPTS"}, {header: "QUARANTINED"}, {header: "BLOCKED"}, {header: "LAST ERROR"}}, rows)
		return
	}
	for _, e := range events {
		rows = append(rows, []string{e.ID.String(), fmt.Sprintf("%s/%s#%d", e.AggregateType, e.AggregateID, e.Sequence), e.Type,
			fmt.Sprint(e.Attempts), opAge(now.Sub(quarantinedAt(e))), fmt.Sprint(e.Blocked), redact.Text(e.LastError)})
	}
	// The event id stays whole: it is what retry and skip take.
	writeFitted(w, defaultWidth, []fitColumn{{header: "EVENT ID"}, {header: "AGGREGATE", min: 16, middle: true}, {header: "TYPE", min: 10},
		{header: "ATTEMPTS"}, {header: "AGE"}, {header: "BLOCKED"}, {header: "LAST ERROR", min: 20, weight: 2}}, rows)
}

// quarantinedAt is when e was quarantined (the zero time if it is not).
func quarantinedAt(e outbox.EventInfo) time.Time {
	if e.QuarantinedAt == nil {
		return time.Time{}
	}
	return *e.QuarantinedAt
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
