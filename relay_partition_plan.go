package outbox

// How a partitioned outbox's relay statements are planned. PostgreSQL
// plans a prepared statement anew (a custom plan, for its arguments) on
// each of its first five runs on a connection, and after that as long as
// a generic plan is estimated dearer, which on a partitioned table it
// always is (a custom plan prunes the partitions its arguments exclude):
// the incremental claim and the look were planned at every run (measured:
// 8 custom plans in 8 runs). A plan of those statements lists every
// partition in each of their ~20 references to outbox_events, and
// planning one took longer than running it (BENCHMARKS.md, "The
// partitioned claim's planning"). So on a partitioned outbox each relay
// statement on outbox_events runs after a statement, in the same implicit
// transaction (one pipelined batch, one round trip), that sets
// plan_cache_mode to force_generic_plan and jit to off for that
// transaction only: one plan per connection, kept until a partition is
// created or dropped (which invalidates it), and never JIT-compiled (a
// plan over dozens of partitions is estimated above jit_above_cost; one
// claim spent 49 of 51 s compiling on a pool with JIT on). The
// partitions a generic plan cannot prune when it is made are pruned when
// it starts (the arguments) or for each row (the near lookups' ids), as
// in a custom plan. The application's own statements on the same pool,
// and a plain table's relay statements, are planned as before.

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// partitionPlanSQL sets, for the rest of the (implicit) transaction,
// what partitionedDB's statements are planned with.
const partitionPlanSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('jit', 'off', true)`

// relayDB is what the relay runs its statements on: a pool or a
// transaction of pgx.
type relayDB interface {
	querier
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// planned returns q, or on a partitioned outbox q with each statement and
// batch preceded by partitionPlanSQL (see partitionedDB).
func (r *Relay) planned(q relayDB) relayDB {
	if !r.partitioned {
		return q
	}
	return partitionedDB{q}
}

// plannedQ is planned for a querier that is a pool or a transaction (as
// the relay's are); any other is returned as it is.
func (r *Relay) plannedQ(q querier) querier {
	if db, ok := q.(relayDB); ok {
		return r.planned(db)
	}
	return q
}

// partitionedDB runs each statement (each batch) of db in one pipelined
// batch after partitionPlanSQL: one implicit transaction, so the settings
// end with it, and the connection goes back to the pool as it came.
type partitionedDB struct{ db relayDB }

// SendBatch sends b after partitionPlanSQL; the results are b's.
func (p partitionedDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	var nb pgx.Batch
	nb.Queue(partitionPlanSQL)
	nb.QueuedQueries = append(nb.QueuedQueries, b.QueuedQueries...)
	res := p.db.SendBatch(ctx, &nb)
	_, err := res.Exec()
	return planResults{BatchResults: res, err: err}
}

func (p partitionedDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	var b pgx.Batch
	b.Queue(sql, args...)
	res := p.SendBatch(ctx, &b)
	rows, err := res.Query()
	if err != nil {
		_ = res.Close()
		return rows, err
	}
	return &batchRows{Rows: rows, res: res}, nil
}

func (p partitionedDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := p.Query(ctx, sql, args...)
	return batchRow{rows: rows, err: err}
}

func (p partitionedDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	var b pgx.Batch
	b.Queue(sql, args...)
	res := p.SendBatch(ctx, &b)
	tag, err := res.Exec()
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// planResults are a batch's results after partitionPlanSQL's: when that
// failed, each of them fails with its error.
type planResults struct {
	pgx.BatchResults
	err error
}

func (r planResults) Exec() (pgconn.CommandTag, error) {
	if r.err != nil {
		return pgconn.CommandTag{}, r.err
	}
	return r.BatchResults.Exec()
}

func (r planResults) Query() (pgx.Rows, error) {
	if r.err != nil {
		return nil, r.err
	}
	return r.BatchResults.Query()
}

func (r planResults) QueryRow() pgx.Row {
	if r.err != nil {
		return batchRow{err: r.err}
	}
	return r.BatchResults.QueryRow()
}

func (r planResults) Close() error {
	err := r.BatchResults.Close()
	if r.err != nil {
		return r.err
	}
	return err
}

// batchRows are a statement's rows read from a batch of its own: closing
// them closes the batch (and gives the connection back).
type batchRows struct {
	pgx.Rows
	res pgx.BatchResults
	err error
}

func (b *batchRows) Close() {
	b.Rows.Close()
	if b.res != nil {
		b.err = b.res.Close()
		b.res = nil
	}
}

func (b *batchRows) Next() bool {
	if b.Rows.Next() {
		return true
	}
	b.Close()
	return false
}

func (b *batchRows) Err() error {
	if err := b.Rows.Err(); err != nil {
		return err
	}
	return b.err
}

// batchRow is pgx.Row for partitionedDB.QueryRow.
type batchRow struct {
	rows pgx.Rows
	err  error
}

func (r batchRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}
