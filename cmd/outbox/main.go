// Command outbox runs and operates the transactional outbox: it migrates the
// schema, relays events to a destination and runs the demo.
//
// Every flag falls back to an environment variable (DATABASE_URL,
// OUTBOX_DESTINATION, OUTBOX_SCHEMA, ...); run "outbox <command> --help".
package main

import "github.com/pgoutbox/outbox/internal/cli"

func main() {
	cli.Main("outbox", "outbox: a transactional outbox for PostgreSQL", []cli.Command{
		{Name: "migrate", Summary: "create or upgrade the outbox tables", Run: runMigrate},
		{Name: "relay", Summary: "publish committed events to the destination", Run: runRelay},
		{Name: "demo", Summary: "run the order system end to end and check the invariants", Run: runDemo},
	})
}
