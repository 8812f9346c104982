package main

import (
	"context"
	"fmt"

	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

func runMigrate(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "migrate", "migrate [--database-url URL] [--schema NAME] [--print | --print-grants [--writer-role R] [--relay-role R] [--operator-role R] [--consumer-role R]]")
	var common cli.Common
	common.Register(fs)
	print := fs.Bool("print", false, "print the SQL for the schema instead of applying it (for your own migration tool)")
	printGrants := fs.Bool("print-grants", false, "print the GRANT statements that give the writer, relay, operator and consumer roles least privilege on the schema (run them as the tables' owner; see docs/operations.md, Security, Roles)")
	var roles outboxmigrate.Roles
	fs.StringVar(&roles.Writer, "writer-role", outboxmigrate.WriterRoleDefault, "with --print-grants: the application's role (Writer, Notifier)")
	fs.StringVar(&roles.Relay, "relay-role", outboxmigrate.RelayRoleDefault, "with --print-grants: the relay's role")
	fs.StringVar(&roles.Operator, "operator-role", outboxmigrate.OperatorRoleDefault, "with --print-grants: the role of outbox status, quarantine, replay, cleanup and inbox")
	fs.StringVar(&roles.Consumer, "consumer-role", outboxmigrate.ConsumerRoleDefault, "with --print-grants: the role of a consumer's inbox (inbox.Inbox)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *print && *printGrants {
		return cli.Usagef(fs, "--print and --print-grants are exclusive")
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
		text, err := outboxmigrate.SQL(common.Schema)
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
	res, err := outboxmigrate.Migrate(ctx, pool, common.Schema)
	if err != nil {
		return err
	}
	if len(res.Applied) == 0 {
		fmt.Printf("schema %s is up to date (version %d)\n", common.Schema, res.Current)
	} else {
		fmt.Printf("schema %s migrated to version %d (applied %v)\n", common.Schema, res.Current, res.Applied)
	}
	return nil
}
