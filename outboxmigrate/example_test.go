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
	// GRANT EXECUTE ON FUNCTION "shop".enqueue(text, text, text, bytea, text, jsonb, text, integer, uuid) TO "shop_app";
	// GRANT EXECUTE ON FUNCTION "shop".enqueue(text, text, text, text, text, jsonb, text, integer, uuid) TO "shop_app";
	// GRANT EXECUTE ON FUNCTION "shop".enqueue_many(jsonb) TO "shop_app";
	// GRANT EXECUTE ON FUNCTION "shop".wake() TO "shop_app";
}
