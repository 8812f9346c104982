// Package outboxfleet relays the events of many outboxes in one process:
// `outbox relay --config relay.yaml`.
//
// A [Config] lists databases, destinations and sources. A source is one
// outbox (a database and a schema) or every schema of a database matching a
// pattern, discovered as it appears (once its migrations are complete) and
// retired when it is dropped; each source has a route: one destination, or
// destinations by aggregate type. Each source is served by an
// outbox.Relay, with every guarantee of a relay of its own; what the fleet
// adds is sharing.
//
// # Shared connections
//
// The sources of a database share one pool of at most max_conns connections
// (Database.MaxConns) and one LISTEN connection, which LISTENs on every
// source's channel (outbox.NotifyChannel) and wakes the source notified.
// The look for due events in idle sources (below) has one more connection
// of its own, so that it never holds one a source's claim waits for.
// Destinations are opened once and shared by the sources that route to
// them.
//
// # Trust
//
// PostgreSQL runs a view's function, a rule or a trigger with the role of
// the statement that fires it, here the relay's. A schema (named or matched
// by a pattern) is served only when it and each of its outbox tables are
// owned by a role of its database's TrustedOwners (default: the connecting
// role only; by name, not membership), are tables, and carry no rule and
// no trigger of another role's function; otherwise it is "untrusted" in
// Sources and Ready, naming the object and its owner, and is not read
// beyond the catalogue. Every source is checked again at each discovery,
// and a running one refused since is stopped. When the tables are owned by
// a migration role and the relay connects as another, list the migration
// role.
//
// # Fairness
//
// A source's relay holds a connection only for one statement at a time (a
// claim, a mark), and a few at once at most (its claim ahead, its
// background full scan, its upkeep); the pool hands connections out in the
// order they were asked for. So a backlog in one source takes turns with the
// others instead of starving them: the other sources' claims wait for at most
// the statements queued before them, not for the backlog.
//
// # Idle sources cost almost nothing
//
// A source's relay does not poll on its own schedule while idle: its polls
// and periodic upkeep (heartbeat, lane sweep, vacuum, clean-up) back off up
// to RelaySettings.IdleMax (outbox.RelayConfig.IdleBackoffMax). Instead,
// once per PollInterval, one statement per database asks for all the idle
// sources at once whether any holds an event a claim would take, and wakes
// those that do; wake-ups from writers that notify arrive at once through
// the shared LISTEN. A source whose last claim found events is not idle,
// however long its claims take: its relay claims again once it has
// published them, and the look leaves it out (a look over a large backlog
// costs seconds). docs/operations.md ("One relay for many outboxes") has
// the measured cost.
//
// # Routes by aggregate type
//
// An aggregate type is routed to one destination: every event of an
// aggregate carries its type, so all of them go to that destination, and
// the relay's per-aggregate order holds there. The configuration refuses an
// aggregate type named by two routes. A destination that cannot be reached
// holds its route's events (outbox.RouteUnavailable) while the others go
// on.
//
// # Health
//
// [Fleet.Ready] names each database that cannot be listed and each source
// that is not ready (its relay's Ready, or why it is not running);
// [Fleet.Sources] lists them all. With Options.Registerer, every source
// exports package outboxprom's series with the labels source
// ("<database>/<schema>") and database.
package outboxfleet
