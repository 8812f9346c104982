package outboxmigrate_test

import (
	"fmt"
	"strings"

	"github.com/pgoutbox/outbox/outboxmigrate"
)

// The application's role may only append events; run the whole script as
// the tables' owner.
func ExampleGrants() {
	script, err := outboxmigrate.Grants("shop", outboxmigrate.Roles{Writer: "shop_app"})
	if err != nil {
		panic(err)
	}
	for _, line := range strings.Split(script, "\n") {
		if strings.HasPrefix(line, "GRANT") && strings.Contains(line, `"shop_app"`) {
			fmt.Println(line[:strings.Index(line, ";")+1])
		}
	}
	// Output:
	// GRANT USAGE ON SCHEMA "shop" TO "shop_app";
	// GRANT SELECT, INSERT, UPDATE ON "shop"."outbox_aggregates" TO "shop_app";
	// GRANT INSERT ON "shop"."outbox_events" TO "shop_app";
	// GRANT SELECT (event_id, aggregate_sequence, occurred_at) ON "shop"."outbox_events" TO "shop_app";
}
