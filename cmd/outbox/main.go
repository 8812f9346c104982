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
		{Name: "status", Summary: "is it healthy, what is stuck: backlog, leases, quarantine, relays, sizes", Run: runStatus},
		{Name: "quarantine", Summary: "list, retry or skip quarantined events", Run: runQuarantine},
		{Name: "inbox", Summary: "consumers' aggregates waiting on a gap: status, resolve", Run: runInbox},
		{Name: "sideeffect", Summary: "consumers' external calls parked for an operator: parked, show, resolve", Run: runSideEffect},
		{Name: "replay", Summary: "publish already-published events again, in order, with their ids", Run: runReplay},
		{Name: "console", Summary: "serve the operator console in the browser (status, health, quarantine, replay, inbox, side effects)", Run: runConsole},
		{Name: "cleanup", Summary: "delete settled events (and inbox rows) past their horizon", Run: runCleanup},
		{Name: "demo", Summary: "run the order system end to end and check the invariants", Run: runDemo},
		{Name: "asyncapi", Summary: "print the AsyncAPI 3 document of what a relay publishes (channels, CloudEvents headers, ordering key)", Run: runAsyncAPI},
		{Name: "chaos", Summary: "run the order system as processes under injected faults and check I1-I5", Run: runChaos},
		{Name: "healthcheck", Summary: "exit 0 when the relay's /healthz (or --url) answers: the HEALTHCHECK of an image without curl", Run: runHealthcheck},
		{Name: "version", Summary: "print the module version, VCS commit, Go version and schema migration of this binary (also --version)", Run: runVersion},
	})
}
