// Command orders runs the parts of the example order system, each as its own
// process:
//
//	orders api         the order HTTP API (writes orders and their events)
//	orders inventory   the inventory consumer (reserves stock from the events)
//	orders provider    the fake payment provider (its own schema and ledger)
//	orders payments    the payments consumer (charges and refunds at the provider)
//	orders saga run    the saga consumer (confirms or cancels orders)
//
// Events travel from the API's outbox table to NATS JetStream through a
// relay: run "outbox relay", or pass --relay to "orders api". Every part
// applies its own migrations at start. Flags fall back to environment
// variables (DATABASE_URL, OUTBOX_SCHEMA, OUTBOX_DESTINATION, ...); run
// "orders <command> --help".
package main

import "github.com/pgoutbox/outbox/internal/cli"

func main() {
	cli.Main("orders", "orders: the example order system of the transactional outbox", []cli.Command{
		{Name: "api", Summary: "serve the order HTTP API", Run: runAPI},
		{Name: "inventory", Summary: "reserve and release stock for order events", Run: runInventory},
		{Name: "provider", Summary: "run the fake payment provider (charges, refunds, ledger, faults)", Run: runProvider},
		{Name: "payments", Summary: "charge reserved orders and refund cancelled ones at the provider (the saga's payment step)", Run: runPayments},
		{Name: "saga", Summary: "the order saga: run its consumer; show, count and resolve sagas", Run: runSaga},
	})
}
