package main

import (
	"context"
	"fmt"

	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

func runMigrate(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "migrate", "migrate [--database-url URL] [--schema NAME] [--print]")
	var common cli.Common
	common.Register(fs)
	print := fs.Bool("print", false, "print the SQL for the schema instead of applying it (for your own migration tool)")
	if err := cli.Parse(fs, args); err != nil {
		return err
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
