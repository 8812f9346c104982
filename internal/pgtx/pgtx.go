// Package pgtx lets one implementation of a component's statements run on
// either kind of transaction a Go application holds: a pgx one (pgx.Tx,
// *pgxpool.Pool) or a database/sql one (*sql.Tx, *sql.DB, from sqlx, GORM,
// bun or ent, over any PostgreSQL driver).
//
// The statements are the same text for both; only the call differs. Two
// differences are smoothed over: a query that returns no row fails with an
// error matching pgx.ErrNoRows (and sql.ErrNoRows) on both, and Rows.Close
// returns the error a database/sql result set reports when closed.
package pgtx

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Querier runs statements: in a transaction, or on a pool or database.
type Querier interface {
	// Exec runs a statement and returns the rows it affected.
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	// QueryRow runs a query returning at most one row; its Scan fails with
	// an error matching pgx.ErrNoRows when there is none.
	QueryRow(ctx context.Context, sql string, args ...any) Row
	// Query runs a query; the caller closes the rows.
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
	// ExecAll runs statements in order, stopping at the first error: in one
	// round trip on pgx (a batch), one each on database/sql.
	ExecAll(ctx context.Context, stmts ...Stmt) error
}

// Stmt is a statement and its arguments, for ExecAll.
type Stmt struct {
	SQL  string
	Args []any
}

// Row is one row of QueryRow.
type Row interface {
	Scan(dest ...any) error
}

// Rows is the result of Query.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}

// TxOptions are a transaction's isolation level and access mode.
type TxOptions struct {
	RepeatableRead bool
	ReadOnly       bool
}

// DB begins transactions.
type DB interface {
	Querier
	// BeginFunc runs fn in a new transaction, committed when fn returns nil
	// and rolled back otherwise (fn's error is returned).
	BeginFunc(ctx context.Context, opts TxOptions, fn func(tx Querier) error) error
}

// pgxQuerier is what pgx.Tx, *pgx.Conn and *pgxpool.Pool have in common.
type pgxQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// sqlQuerier is what *sql.Tx, *sql.DB and *sql.Conn have in common.
type sqlQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// PgxTx is a Querier over a pgx transaction (or pool, or connection).
type PgxTx struct{ Tx pgxQuerier }

// Pgx returns a Querier over q: a pgx.Tx, *pgx.Conn or *pgxpool.Pool.
func Pgx(q pgxQuerier) PgxTx { return PgxTx{Tx: q} }

func (p PgxTx) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := p.Tx.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func (p PgxTx) QueryRow(ctx context.Context, sql string, args ...any) Row {
	return p.Tx.QueryRow(ctx, sql, args...)
}

func (p PgxTx) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	r, err := p.Tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgxRows{r}, nil
}

func (p PgxTx) ExecAll(ctx context.Context, stmts ...Stmt) error {
	b := &pgx.Batch{}
	for _, s := range stmts {
		b.Queue(s.SQL, s.Args...)
	}
	return p.Tx.SendBatch(ctx, b).Close()
}

type pgxRows struct{ pgx.Rows }

func (r pgxRows) Close() error {
	r.Rows.Close()
	return r.Rows.Err()
}

// SQLTx is a Querier over a database/sql transaction (or database, or
// connection).
type SQLTx struct{ Tx sqlQuerier }

// SQL returns a Querier over q: a *sql.Tx, *sql.DB or *sql.Conn.
func SQL(q sqlQuerier) SQLTx { return SQLTx{Tx: q} }

func (s SQLTx) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := s.Tx.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, nil // the driver does not count: only tests read it
	}
	return n, nil
}

func (s SQLTx) QueryRow(ctx context.Context, query string, args ...any) Row {
	return sqlRow{s.Tx.QueryRowContext(ctx, query, args...)}
}

func (s SQLTx) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	r, err := s.Tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (s SQLTx) ExecAll(ctx context.Context, stmts ...Stmt) error {
	for _, st := range stmts {
		if _, err := s.Tx.ExecContext(ctx, st.SQL, st.Args...); err != nil {
			return err
		}
	}
	return nil
}

type sqlRow struct{ r *sql.Row }

// Scan turns sql.ErrNoRows into pgx.ErrNoRows (which wraps it), so that one
// check serves both kinds.
func (r sqlRow) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return pgx.ErrNoRows
	}
	return err
}

// PgxPool is a DB over a pgx pool.
type PgxPool struct {
	PgxTx
	Pool *pgxpool.Pool
}

// Pool returns a DB over p.
func Pool(p *pgxpool.Pool) PgxPool { return PgxPool{PgxTx: Pgx(p), Pool: p} }

func (p PgxPool) BeginFunc(ctx context.Context, opts TxOptions, fn func(Querier) error) error {
	o := pgx.TxOptions{}
	if opts.RepeatableRead {
		o.IsoLevel = pgx.RepeatableRead
	}
	if opts.ReadOnly {
		o.AccessMode = pgx.ReadOnly
	}
	return pgx.BeginTxFunc(ctx, p.Pool, o, func(tx pgx.Tx) error { return fn(Pgx(tx)) })
}

// PgxConn is a DB over one connection of a pgx pool: its statements and
// transactions all run on that connection (the session a session-level
// advisory lock belongs to).
type PgxConn struct {
	PgxTx
	Conn *pgxpool.Conn
}

// Conn returns a DB over c.
func Conn(c *pgxpool.Conn) PgxConn { return PgxConn{PgxTx: Pgx(c), Conn: c} }

func (c PgxConn) BeginFunc(ctx context.Context, opts TxOptions, fn func(Querier) error) error {
	o := pgx.TxOptions{}
	if opts.RepeatableRead {
		o.IsoLevel = pgx.RepeatableRead
	}
	if opts.ReadOnly {
		o.AccessMode = pgx.ReadOnly
	}
	return pgx.BeginTxFunc(ctx, c.Conn, o, func(tx pgx.Tx) error { return fn(Pgx(tx)) })
}

// SQLDB is a DB over a database/sql database.
type SQLDB struct {
	SQLTx
	DB *sql.DB
}

// Database returns a DB over db.
func Database(db *sql.DB) SQLDB { return SQLDB{SQLTx: SQL(db), DB: db} }

func (d SQLDB) BeginFunc(ctx context.Context, opts TxOptions, fn func(Querier) error) error {
	return sqlBeginFunc(ctx, d.DB.BeginTx, opts, fn)
}

// sqlBeginFunc runs fn in a transaction begun by begin (a database's or a
// connection's BeginTx), committed when fn returns nil.
func sqlBeginFunc(ctx context.Context, begin func(context.Context, *sql.TxOptions) (*sql.Tx, error), opts TxOptions, fn func(Querier) error) error {
	o := &sql.TxOptions{ReadOnly: opts.ReadOnly}
	if opts.RepeatableRead {
		o.Isolation = sql.LevelRepeatableRead
	}
	tx, err := begin(ctx, o)
	if err != nil {
		return err
	}
	// Rolled back unless committed: on fn's error and also when fn
	// panics (as pgx.BeginTxFunc does), so that a panic the application
	// recovers from leaves no transaction open holding its connection and
	// locks until the context ends.
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	if err = fn(SQL(tx)); err != nil {
		return err
	}
	committed = true
	return tx.Commit()
}

// PgxOf returns the pgx transaction under q, if q is one.
func PgxOf(q Querier) (pgx.Tx, bool) {
	p, ok := q.(PgxTx)
	if !ok {
		return nil, false
	}
	tx, ok := p.Tx.(pgx.Tx)
	return tx, ok
}

// SQLOf returns the database/sql transaction under q, if q is one.
func SQLOf(q Querier) (*sql.Tx, bool) {
	s, ok := q.(SQLTx)
	if !ok {
		return nil, false
	}
	tx, ok := s.Tx.(*sql.Tx)
	return tx, ok
}

// Collect reads every row of rows with fn and closes rows; like
// pgx.CollectRows, it returns an empty, non-nil slice when there is no row.
func Collect[T any](rows Rows, fn func(row Row) (T, error)) ([]T, error) {
	defer rows.Close()
	out := []T{}
	for rows.Next() {
		v, err := fn(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, rows.Close()
}

// SQLConn is a DB over one connection of a database/sql database: its
// statements and transactions all run on that connection (one session).
type SQLConn struct {
	SQLTx
	Conn *sql.Conn
}

// SQLConnOf returns a DB over c.
func SQLConnOf(c *sql.Conn) SQLConn { return SQLConn{SQLTx: SQL(c), Conn: c} }

func (c SQLConn) BeginFunc(ctx context.Context, opts TxOptions, fn func(Querier) error) error {
	return sqlBeginFunc(ctx, c.Conn.BeginTx, opts, fn)
}
