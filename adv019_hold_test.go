package outbox

// The order check of a transaction's later calls as f2e07cb rewrote it
// (the writer's laterCallOKSQL, enqueue_hold of migration 019): tests of
// the adv019 hostile review. The rewrite must keep the rule (a later call
// names only aggregates held already or sorting after every one held), the
// held set it records, and the agreement of the writer's check with
// enqueue_hold's, for writers and schemas of either version.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// preHold019CheckSQL is laterCallOKSQL as a writer of the release before
// migration 019 runs it (f2e07cb~1): such a writer may meet a schema at 019.
const preHold019CheckSQL = `(SELECT wrote.w IS NULL OR NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text($2::jsonb) k
	WHERE NOT jsonb_exists(wrote.w, k)
	  AND (split_part(k, chr(31), 1), split_part(k, chr(31), 2), split_part(k, chr(31), 3)) < (
		SELECT split_part(h, chr(31), 1), split_part(h, chr(31), 2), split_part(h, chr(31), 3)
		FROM jsonb_array_elements_text(wrote.w) h ORDER BY 1 DESC, 2 DESC, 3 DESC LIMIT 1))
FROM (SELECT nullif(current_setting('` + wroteSetting + `', true), '')::jsonb AS w) wrote)`

// adv019Schema is a new schema of the test database migrated through
// migration last (every migration when last is 0), dropped at the test's
// end: a schema at 018 is what a writer of this release meets before its
// database is upgraded.
func adv019Schema(t *testing.T, pool *pgxpool.Pool, prefix string, last int) string {
	t.Helper()
	ctx := context.Background()
	if last == 0 {
		_, schema := outboxtest.SchemaNamed(t, outboxtest.UniqueName(t, prefix))
		return schema
	}
	schema := outboxtest.UniqueName(t, prefix)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	for _, m := range outboxmigrate.All() {
		if m.Version > last {
			break
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, q := range []string{
				"CREATE SCHEMA IF NOT EXISTS " + schema,
				"SET LOCAL search_path TO " + schema,
				`CREATE TABLE IF NOT EXISTS outbox_schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
					applied_at timestamptz NOT NULL DEFAULT now())`,
				m.SQL,
			} {
				if _, err := tx.Exec(ctx, q); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `INSERT INTO outbox_schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
			return err
		})
		if err != nil {
			t.Fatalf("migration %d: %v", m.Version, err)
		}
	}
	return schema
}

// TestAdv019LaterCallChecksAgree drives random calls (one to three events
// of a small set of aggregates whose types and ids order differently by
// byte and by collation, in two schemas, so that the held set has entries
// of another schema) through one transaction after another, and checks
// each call against a model of the rule, with the database's order of
// (schema, type, id) as its only input: enqueue_many (in a savepoint
// rolled back after), the writer's check of this release and of the
// previous one, and InsertTx must all accept exactly the calls the model
// accepts (InsertTx refusing with ErrInsertOrder, never by an abort), and
// outbox.wrote must hold exactly the aggregates the model holds. On a
// schema at 018 (enqueue_hold of migration 011: a writer of this release
// before the upgrade) and at the latest.
func TestAdv019LaterCallChecksAgree(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		last int
	}{{"migration_018", 18}, {"latest", 0}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			adv019Agree(t, c.last)
		})
	}
}

type adv019Key struct{ schema, typ, id string }

func adv019Agree(t *testing.T, last int) {
	ctx := context.Background()
	pool := outboxtest.Pool(t)
	schemas := []string{adv019Schema(t, pool, "h1", last), adv019Schema(t, pool, "h2", last)}
	writers := make([]*Writer, len(schemas))
	for i, s := range schemas {
		w, err := NewWriter(WriterConfig{Schema: s})
		if err != nil {
			t.Fatal(err)
		}
		writers[i] = w
	}
	// Upper and lower case, punctuation and a space, digits, a non-ASCII
	// letter: byte order and a linguistic collation disagree on them.
	types := []string{"a", "B", "a-b", "é"}
	ids := []string{"1", "10", "9", "x y", "X"}
	var all []adv019Key
	var ss, ts, is []string
	for _, s := range schemas {
		for _, typ := range types {
			for _, id := range ids {
				all = append(all, adv019Key{s, typ, id})
				ss, ts, is = append(ss, s), append(ts, typ), append(is, id)
			}
		}
	}
	// The model's order is the database's, asked once of plain columns.
	rank := map[adv019Key]int{}
	rs, err := pool.Query(ctx, `SELECT s, t, i FROM unnest($1::text[], $2::text[], $3::text[]) AS u(s, t, i) ORDER BY s, t, i`, ss, ts, is)
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var k adv019Key
		if err := rs.Scan(&k.schema, &k.typ, &k.id); err != nil {
			t.Fatal(err)
		}
		rank[k] = len(rank)
	}
	if rs.Err() != nil || len(rank) != len(all) {
		t.Fatalf("order of %d keys: %d ranked (%v)", len(all), len(rank), rs.Err())
	}

	newCheck := `SELECT ` + strings.ReplaceAll(laterCallOKSQL, "$2", "$1")
	oldCheck := `SELECT ` + strings.ReplaceAll(preHold019CheckSQL, "$2", "$1")
	r := rand.New(rand.NewSource(19))
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	refused, accepted := 0, 0
	for round := 0; round < 8; round++ {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held := map[adv019Key]bool{}
		top := -1
		for step := 0; step < 40; step++ {
			si := r.Intn(len(schemas))
			s, _ := pgident.NewSchema(schemas[si])
			n := 1 + r.Intn(3)
			evs := make([]Event, n)
			var keys []adv019Key
			var heldArg []string
			var doc []map[string]any
			seen := map[adv019Key]bool{}
			want := true
			// Three events in four name an aggregate the rule allows (held, or
			// sorting after every one held), so that transactions grow.
			var allowed []adv019Key
			for _, k := range all {
				if k.schema == schemas[si] && (held[k] || rank[k] > top) {
					allowed = append(allowed, k)
				}
			}
			for i := range evs {
				k := adv019Key{schemas[si], types[r.Intn(len(types))], ids[r.Intn(len(ids))]}
				if len(allowed) > 0 && r.Intn(4) != 0 {
					k = allowed[r.Intn(len(allowed))]
				}
				evs[i] = Event{AggregateType: k.typ, AggregateID: k.id, Type: "Touched", Payload: []byte(`{}`)}
				doc = append(doc, map[string]any{"aggregate_type": k.typ, "aggregate_id": k.id, "event_type": "Touched", "payload": map[string]any{}})
				if !seen[k] {
					seen[k] = true
					keys = append(keys, k)
					heldArg = append(heldArg, heldKey(s, k.typ, k.id))
				}
				if !held[k] && rank[k] < top {
					want = false
				}
			}
			call := fmt.Sprintf("round %d step %d: call %v with held %v", round, step, keys, adv019Held(held))
			docArg, _ := json.Marshal(doc)
			keysArg, _ := json.Marshal(heldArg)

			if _, err := tx.Exec(ctx, "SAVEPOINT adv019"); err != nil {
				t.Fatal(err)
			}
			_, err := tx.Exec(ctx, `SELECT count(*) FROM `+s.Quoted()+`.enqueue_many($1::jsonb)`, string(docArg))
			var pgErr *pgconn.PgError
			if err != nil && (!errors.As(err, &pgErr) || pgErr.Code != "55000") {
				t.Fatalf("%s: enqueue_many: %v", call, err)
			}
			sqlOK := err == nil
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT adv019"); err != nil {
				t.Fatal(err)
			}
			var newOK, oldOK bool
			if err := tx.QueryRow(ctx, newCheck, string(keysArg)).Scan(&newOK); err != nil {
				t.Fatalf("%s: the writer's check: %v", call, err)
			}
			if err := tx.QueryRow(ctx, oldCheck, string(keysArg)).Scan(&oldOK); err != nil {
				t.Fatalf("%s: the previous writer's check: %v", call, err)
			}
			// The call is made for good through one door or the other (the
			// held set they leave must be alike): InsertTx, or, in a
			// savepoint rolled back after InsertTx was asked, enqueue or
			// enqueue_many.
			sqlDoor := r.Intn(2) == 0
			if sqlDoor {
				if _, err := tx.Exec(ctx, "SAVEPOINT adv019"); err != nil {
					t.Fatal(err)
				}
			}
			_, err = writers[si].InsertTx(ctx, tx, evs...)
			if err != nil && !errors.Is(err, ErrInsertOrder) {
				t.Fatalf("%s: InsertTx: %v (want nil or ErrInsertOrder; the transaction must stay usable)", call, err)
			}
			goOK := err == nil
			if sqlDoor {
				if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT adv019"); err != nil {
					t.Fatal(err)
				}
				err = nil
				if want && len(evs) == 1 {
					_, err = tx.Exec(ctx, `SELECT count(*) FROM `+s.Quoted()+`.enqueue($1::text, $2::text, 'Touched', '{}'::text)`, evs[0].AggregateType, evs[0].AggregateID)
				} else if want {
					_, err = tx.Exec(ctx, `SELECT count(*) FROM `+s.Quoted()+`.enqueue_many($1::jsonb)`, string(docArg))
				}
				if err != nil {
					t.Fatalf("%s: the SQL door, for good: %v", call, err)
				}
			}
			if sqlOK != want || newOK != want || oldOK != want || goOK != want {
				t.Fatalf("%s: the rule says %v; enqueue_many %v, the writer's check %v, the previous writer's %v, InsertTx %v",
					call, want, sqlOK, newOK, oldOK, goOK)
			}
			if want {
				accepted++
				for _, k := range keys {
					held[k] = true
					if rank[k] > top {
						top = rank[k]
					}
				}
			} else {
				refused++
			}
			var got []string
			if err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(x ORDER BY x COLLATE "C"), '{}')
				FROM jsonb_array_elements_text(nullif(current_setting('`+wroteSetting+`', true), '')::jsonb) x`).Scan(&got); err != nil {
				t.Fatal(err)
			}
			var model []string
			for k := range held {
				ks, _ := pgident.NewSchema(k.schema)
				model = append(model, heldKey(ks, k.typ, k.id))
			}
			sort.Strings(model)
			if strings.Join(got, "|") != strings.Join(model, "|") {
				t.Fatalf("%s: outbox.wrote holds %q, want %q", call, got, model)
			}
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if refused == 0 || accepted == 0 {
		t.Fatalf("%d calls accepted, %d refused: the walk must see both", accepted, refused)
	}
	t.Logf("%d calls accepted, %d refused, all four agreeing", accepted, refused)
}

// adv019Held lists a held set for a failure message.
func adv019Held(held map[adv019Key]bool) []adv019Key {
	var out []adv019Key
	for k := range held {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return a.schema+"\x00"+a.typ+"\x00"+a.id < b.schema+"\x00"+b.typ+"\x00"+b.id
	})
	return out
}

// TestAdv019RolledBackSavepointReleasesItsAggregates: outbox.wrote
// reverts with a rolled-back savepoint, as the counter-row locks it
// describes do (writer.go, wroteSetting), and stays with a released one.
// After ROLLBACK TO SAVEPOINT the aggregate written inside it is no longer
// locked (another session takes its row at once) and no longer held (a
// call for an aggregate sorting before it is accepted, and the aggregate
// itself again, with the sequence the rolled-back write had); after
// RELEASE SAVEPOINT the aggregate written inside it still bounds the order.
func TestAdv019RolledBackSavepointReleasesItsAggregates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w, err := NewWriter(WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ev := func(id string) Event {
		return Event{AggregateType: "order", AggregateID: id, Type: "Touched", Payload: []byte(`{}`)}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.InsertTx(ctx, tx, ev("D"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// lockD takes D's counter row without waiting, from another session.
	lockD := func() error {
		_, err := pool.Exec(ctx, `SELECT 1 FROM `+schema+`.outbox_aggregates
			WHERE aggregate_type = 'order' AND aggregate_id = 'D' FOR UPDATE NOWAIT`)
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	exec := func(q string) {
		t.Helper()
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	insert := func(id string) ([]Recorded, error) { return w.InsertTx(ctx, tx, ev(id)) }
	if _, err := insert("B"); err != nil {
		t.Fatal(err)
	}
	exec("SAVEPOINT s")
	if _, err := insert("D"); err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	if err := lockD(); !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("D's row while the savepoint's write holds it: %v, want 55P03 (locked)", err)
	}
	exec("ROLLBACK TO SAVEPOINT s")
	if err := lockD(); err != nil {
		t.Fatalf("D's row after ROLLBACK TO SAVEPOINT: %v, want it free", err)
	}
	if _, err := insert("C"); err != nil {
		t.Fatalf("C after B, D rolled back: %v, want accepted (D is not held)", err)
	}
	recs, err := insert("D")
	if err != nil || recs[0].Sequence != 2 {
		t.Fatalf("D again: %v %v, want sequence 2 (the rolled-back one's)", recs, err)
	}
	exec("SAVEPOINT s2")
	if _, err := insert("E"); err != nil {
		t.Fatal(err)
	}
	exec("RELEASE SAVEPOINT s2")
	if _, err := insert("DA"); !errors.Is(err, ErrInsertOrder) {
		t.Fatalf("DA after E, written in a released savepoint: %v, want ErrInsertOrder", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := pool.QueryRow(ctx, `SELECT string_agg(aggregate_id || ':' || aggregate_sequence, ' ' ORDER BY aggregate_id COLLATE "C", aggregate_sequence)
		FROM `+schema+`.outbox_events`).Scan(&got); err != nil || got != "B:1 C:1 D:1 D:2 E:1" {
		t.Fatalf("events %q (%v), want B:1 C:1 D:1 D:2 E:1", got, err)
	}
}
