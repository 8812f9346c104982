package outboxmigrate

import (
	"fmt"
	"slices"
)

// Components says which of outbox's tables a migration installs.
type Components string

const (
	// ComponentsAll is every table: the outbox's (the producer side: events,
	// counters, relays, the SQL write API) and the consumer side's. What
	// Migrate installs, in a producer's database or one database shared by
	// producers and consumers.
	ComponentsAll Components = "all"
	// ComponentsConsumer is the consumer side only, for a consumer's own
	// database: the inbox (processed_events, inbox_aggregates,
	// inbox_consumers and the SQL inbox functions of migration 12), the
	// side effects (side_effects, and side_effect_waits with its trigger,
	// migration 16) and the audit log their operator actions write
	// (outbox_operations). No outbox_events, no relay tables.
	//
	// Its steps (ConsumerMigrations) are recorded in their own table,
	// outbox_consumer_migrations, not in outbox_schema_migrations: Version
	// and `outbox migrate --status` still read 0 for such a schema (it has
	// no outbox tables), and a later full Migrate of the same schema
	// applies every migration, finding the consumer objects already there
	// and leaving them as they are.
	ComponentsConsumer Components = "consumer"
)

// consumerMigrationsTable records the consumer install's steps.
const consumerMigrationsTable = "outbox_consumer_migrations"

// consumerFromFull are the full migrations that touch only the consumer
// side, which the consumer install runs as they are.
var consumerFromFull = []int{4, 7, 8, 12, 16}

// ConsumerMigrations returns the steps of the consumer install
// (ComponentsConsumer) in order: its own first step (version 1, the
// consumer side's tables as the full migrations 1, 2 and 5 leave them),
// then the full migrations that touch only the consumer side (4, 7, 8, 12,
// 16),
// under their own versions.
func ConsumerMigrations() []Migration {
	out := readDir("consumer")
	for _, m := range All() {
		if slices.Contains(consumerFromFull, m.Version) {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			panic(fmt.Sprintf("two consumer migrations with version %d: %s and %s", out[i].Version, out[i-1].Name, out[i].Name))
		}
	}
	return out
}

// steps returns c's migrations and the table recording them.
func (c Components) steps() ([]Migration, string, error) {
	switch c {
	case ComponentsAll, "":
		return All(), migrationsTable, nil
	case ComponentsConsumer:
		return ConsumerMigrations(), consumerMigrationsTable, nil
	}
	return nil, "", fmt.Errorf("outboxmigrate: unknown components %q: use %q or %q", c, ComponentsAll, ComponentsConsumer)
}
