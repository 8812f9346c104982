// Package pgtrust checks that an outbox schema's code can be trusted before
// a relay or a console reads it with its own database role: the schema and
// every table of the outbox in it are owned by a trusted role and are
// tables (plain or partitioned, their partitions too), and no trigger on
// them calls a function that an untrusted role owns.
//
// Why: PostgreSQL runs a view's functions, a trigger's function, a rule,
// with the privileges of the role whose statement fires them. A tenant
// that owns a schema the relay reads (one a pattern matches, say) could
// make its outbox_relays a view over its own function, or put a trigger on
// its outbox_operations, and have the relay's or the console's role run
// its code. Ownership is compared by name, not by membership: a role the
// connecting role is a member of may still be a tenant's.
package pgtrust

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// Tables are the tables of an outbox schema that the relay, the console and
// the status read or write (outboxmigrate's migrations create them). Those
// present are checked; outbox_events must be.
var Tables = []string{
	"outbox_events", "outbox_aggregates", "outbox_relays", "outbox_operations", "outbox_schema_migrations",
	"inbox_aggregates", "inbox_consumers", "processed_events", "side_effects", "side_effect_waits",
}

// Untrusted is the error of Check when an object is not trusted.
type Untrusted struct {
	Schema string
	// Object names the object ("schema s", "table s.outbox_relays",
	// "trigger t on s.outbox_operations"), Owner its owner (for a
	// trigger, its function's), Why what is wrong.
	Object, Owner, Why string
	Trusted            []string
}

func (e *Untrusted) Error() string {
	return fmt.Sprintf("untrusted: %s %s (owner %s); trusted owners: %v", e.Object, e.Why, e.Owner, e.Trusted)
}

// checkSQL reads, for each schema of $1, the schema's owner, its outbox
// tables' (those of $2) with their partitions', the functions of their
// triggers and their rules, and once the connecting role (with an empty schema).
const checkSQL = `WITH rels AS (
  SELECT n.nspname AS schema, c.oid, c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  WHERE n.nspname = ANY($1::text[]) AND c.relname = ANY($2::text[])
), tree AS (
  SELECT DISTINCT r.schema, p.relid AS oid FROM rels r, LATERAL pg_catalog.pg_partition_tree(r.oid) p
  UNION SELECT schema, oid FROM rels
)
SELECT n.nspname::text AS schema, 0 AS ord, 'schema ' || quote_ident(n.nspname), pg_catalog.pg_get_userbyid(n.nspowner), '', ''
  FROM pg_catalog.pg_namespace n WHERE n.nspname = ANY($1::text[])
UNION ALL
SELECT t.schema::text, 1, 'relation ' || c.oid::regclass::text, pg_catalog.pg_get_userbyid(c.relowner), c.relkind::text, c.relname::text
  FROM tree t JOIN pg_catalog.pg_class c ON c.oid = t.oid
UNION ALL
SELECT t.schema::text, 2, 'trigger ' || quote_ident(tg.tgname) || ' on ' || tg.tgrelid::regclass::text || ' (function ' || tg.tgfoid::regproc::text || ')',
  pg_catalog.pg_get_userbyid(p.proowner), '', ''
  FROM tree t JOIN pg_catalog.pg_trigger tg ON tg.tgrelid = t.oid JOIN pg_catalog.pg_proc p ON p.oid = tg.tgfoid
  WHERE NOT tg.tgisinternal
UNION ALL
SELECT t.schema::text, 3, 'rule ' || quote_ident(rw.rulename) || ' on ' || rw.ev_class::regclass::text, '', '', ''
  FROM tree t JOIN pg_catalog.pg_rewrite rw ON rw.ev_class = t.oid
UNION ALL
SELECT '', 4, 'current_user', current_user::text, '', ''
ORDER BY 1, 2, 3`

// Querier is what Check needs of a pool or a connection.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Check reads the catalogue only (it runs no code of the schema) and
// returns an *Untrusted error naming the first object that is not owned by
// one of trusted (by name; empty means the connecting role, current_user,
// only), that is not a plain or partitioned table, or that is a rule or a
// trigger whose function an untrusted role owns. A schema that does not
// exist, or has no outbox_events table, is an error too.
func Check(ctx context.Context, db Querier, schema string, trusted []string) error {
	errs, err := CheckAll(ctx, db, []string{schema}, trusted)
	if err != nil {
		return fmt.Errorf("check the owners of schema %s: %w", schema, err)
	}
	return errs[schema]
}

// CheckAll checks each of schemas as Check does, all in one statement: the
// map holds Check's error for each schema refused (the others pass). The
// error is the statement's (then nothing was checked).
func CheckAll(ctx context.Context, db Querier, schemas []string, trusted []string) (map[string]error, error) {
	out := map[string]error{}
	if len(schemas) == 0 {
		return out, nil
	}
	rows, err := db.Query(ctx, checkSQL, schemas, Tables)
	if err != nil {
		return nil, err
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[catalogueRow])
	if err != nil {
		return nil, err
	}
	var current string
	bySchema := map[string][]catalogueRow{}
	for _, r := range got {
		if r.Ord == 4 {
			current = r.Owner
			continue
		}
		bySchema[r.Schema] = append(bySchema[r.Schema], r)
	}
	if len(trusted) == 0 {
		trusted = []string{current}
	}
	for _, schema := range schemas {
		if err := judge(schema, bySchema[schema], trusted); err != nil {
			out[schema] = err
		}
	}
	return out, nil
}

// catalogueRow is a row of checkSQL.
type catalogueRow struct {
	Schema                    string
	Ord                       int
	Object, Owner, Kind, Name string
}

// judge returns the error of one schema's catalogue rows (in the order of
// checkSQL), or nil when every object is trusted.
func judge(schema string, rows []catalogueRow, trusted []string) error {
	hasSchema, hasEvents := false, false
	for _, r := range rows {
		ord, object, owner, kind, name := r.Ord, r.Object, r.Owner, r.Kind, r.Name
		bad := func(why string) error {
			return &Untrusted{Schema: schema, Object: object, Owner: owner, Why: why, Trusted: trusted}
		}
		switch ord {
		case 0:
			hasSchema = true
		case 1:
			hasEvents = hasEvents || name == "outbox_events"
			if kind != "r" && kind != "p" {
				return bad(fmt.Sprintf("is not a table (relkind %q)", kind))
			}
		case 3:
			return bad("rewrites the table's statements")
		}
		if !slices.Contains(trusted, owner) {
			return bad("is owned by an untrusted role")
		}
	}
	if !hasSchema {
		return fmt.Errorf("schema %s does not exist", schema)
	}
	if !hasEvents {
		return fmt.Errorf("schema %s has no outbox_events table", schema)
	}
	return nil
}
