package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/cli"
)

const inboxUsage = `inbox status|resolve [flags]

  status [--consumer NAME]    consumers' aggregates waiting on a gap (an event refused as early,
                              an earlier one missing), how many per consumer and since when
  resolve --consumer NAME --aggregate-type T --aggregate-id ID --reason TEXT [--to N]
                              move an aggregate's high-water mark past its gap, so that its
                              waiting event is applied; who, when and why are recorded

A consumer's inbox applies each aggregate's events in sequence order. When an
event never arrives (broker retention, MaxDeliver, a consumer started after
the stream began), the aggregate waits for it forever; these commands show
and end such waits. Run 'outbox inbox <status|resolve> --help' for each one's flags.`

func runInbox(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "inbox", inboxUsage)
	return cli.Dispatch(ctx, fs, args, []cli.Command{
		{Name: "status", Run: inboxStatus},
		{Name: "resolve", Run: inboxResolve},
	})
}

// openInboxAdmin connects, checks the schema and returns an inbox Admin;
// close the pool when done.
func openInboxAdmin(ctx context.Context, common cli.Common) (*inbox.Admin, *pgxpool.Pool, error) {
	pool, err := common.Connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := requireConsumerSchema(ctx, pool, common.Schema); err != nil {
		pool.Close()
		return nil, nil, err
	}
	admin, err := inbox.NewAdmin(pool, inbox.AdminConfig{Schema: common.Schema})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return admin, pool, nil
}

func inboxStatus(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "inbox status", `inbox status [--consumer NAME] [--aggregate-type T] [--limit N] [--json] [flags]

Counts, per consumer, the aggregates waiting on a gap and the oldest wait's age, and lists the
waiting aggregates, oldest wait first (at most --limit): the mark (last sequence applied), the
sequence expected, the lowest one seen since, and since when. Reads only the waiting rows.`)
	var common cli.Common
	common.Register(fs)
	consumer := fs.String("consumer", "", "only this consumer")
	aggType := fs.String("aggregate-type", "", "only this aggregate type")
	limit := fs.Int("limit", 100, "most aggregates listed")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if *limit < 1 {
		return cli.Usagef(fs, "--limit %d must be positive", *limit)
	}
	admin, pool, err := openInboxAdmin(ctx, common)
	if err != nil {
		return err
	}
	defer pool.Close()
	rep, err := admin.Waiting(ctx, inbox.WaitingFilter{Consumer: *consumer, AggregateType: *aggType, Limit: *limit})
	if err != nil {
		return err
	}
	if *asJSON {
		return opJSON(os.Stdout, rep)
	}
	if len(rep.Consumers) == 0 {
		fmt.Println("no aggregates waiting on a gap")
		return nil
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CONSUMER\tWAITING\tOLDEST")
	total := int64(0)
	for _, c := range rep.Consumers {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", c.Consumer, c.Waiting, opAge(opSeconds(c.OldestWaitSeconds)))
		total += c.Waiting
	}
	tw.Flush()
	fmt.Println()
	fmt.Fprintln(tw, "CONSUMER\tAGGREGATE\tMARK\tEXPECTS\tSEEN\tWAITING SINCE\tAGE")
	for _, a := range rep.Aggregates {
		fmt.Fprintf(tw, "%s\t%s/%s\t%d\t%d\t%d\t%s\t%s\n", a.Consumer, a.AggregateType, a.AggregateID, a.LastSequence,
			a.Wait.Expected, a.Wait.Seen, a.Wait.Since.Format(time.RFC3339), opAge(opSeconds(a.Wait.AgeSeconds)))
	}
	tw.Flush()
	if int64(len(rep.Aggregates)) < total {
		fmt.Printf("(oldest %d of %d shown; use --limit)\n", len(rep.Aggregates), total)
	}
	return nil
}

func inboxResolve(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "inbox resolve", `inbox resolve --consumer NAME --aggregate-type T --aggregate-id ID --reason TEXT [--to N] [--by NAME] [--json] [flags]

Moves a consumer's high-water mark of an aggregate past a gap: the events between the mark and
the new one will never be applied by that consumer. Without --to, the new mark is just below the
lowest sequence seen while waiting, so the waiting event is applied at its next delivery (the
broker redelivers it). With --to N, the mark is set to N (above the current one), also for an
aggregate the consumer never saw. Who, when and why are recorded on the mark and in the audit log.`)
	var common cli.Common
	common.Register(fs)
	var r inbox.Resolution
	fs.StringVar(&r.Consumer, "consumer", "", "the consumer (required)")
	fs.StringVar(&r.AggregateType, "aggregate-type", "", "the aggregate type (required)")
	fs.StringVar(&r.AggregateID, "aggregate-id", "", "the aggregate id (required)")
	fs.Int64Var(&r.To, "to", 0, "the mark to set: events up to `N` count as applied (default: just past the gap)")
	fs.StringVar(&r.Reason, "reason", "", "why the events in the gap are given up, recorded (required)")
	fs.StringVar(&r.By, "by", cli.CurrentUser(), "who resolves, recorded on the mark and in the audit log")
	asJSON := fs.Bool("json", false, "print the aggregate as resolved, as JSON")
	pos, err := cli.ParseWithArgs(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return cli.Usagef(fs, "unexpected argument %q (name the aggregate with --aggregate-type and --aggregate-id)", pos[0])
	case r.Consumer == "":
		return cli.Usagef(fs, "--consumer is required")
	case r.AggregateType == "" || r.AggregateID == "":
		return cli.Usagef(fs, "--aggregate-type and --aggregate-id are required")
	case r.To < 0:
		return cli.Usagef(fs, "--to %d is negative", r.To)
	case r.Reason == "":
		return cli.Usagef(fs, "--reason is required: say why the events in the gap are given up")
	case r.By == "":
		return cli.Usagef(fs, "--by is empty")
	}
	admin, pool, err := openInboxAdmin(ctx, common)
	if err != nil {
		return err
	}
	defer pool.Close()
	a, err := admin.Resolve(ctx, r)
	if err != nil {
		return resolveError(ctx, admin, r, err)
	}
	if *asJSON {
		return opJSON(os.Stdout, a)
	}
	s := a.Start
	fmt.Printf("consumer %s, %s/%s: mark %d -> %d, resolved by %s at %s: events #%d..#%d will not be applied; #%d is applied at its next delivery\n",
		a.Consumer, a.AggregateType, a.AggregateID, s.PriorMark, s.Mark, s.By, s.At.Format(time.RFC3339), s.PriorMark+1, s.Mark, s.Mark+1)
	return nil
}

// resolveError says in one line why resolve refused.
func resolveError(ctx context.Context, admin *inbox.Admin, r inbox.Resolution, err error) error {
	what := fmt.Sprintf("consumer %s, aggregate %s/%s", r.Consumer, r.AggregateType, r.AggregateID)
	mark := ""
	if a, aerr := admin.Aggregate(ctx, r.Consumer, r.AggregateType, r.AggregateID); aerr == nil {
		mark = fmt.Sprintf(" (its mark is %d)", a.LastSequence)
	}
	switch {
	case errors.Is(err, inbox.ErrAggregateNotFound):
		return fmt.Errorf("resolve: %s: no mark and no wait recorded in schema %s (check the names, or pass --to N to set a mark)", what, admin.Schema())
	case errors.Is(err, inbox.ErrNotWaiting):
		return fmt.Errorf("resolve: %s is not waiting on a gap%s; pass --to N to move its mark anyway", what, mark)
	case errors.Is(err, inbox.ErrMarkAhead):
		return fmt.Errorf("resolve: %s: --to %d is not above the mark%s; a mark never goes back", what, r.To, mark)
	}
	return err
}
