package pgretry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/pgretry"
)

// killed returns the error of a statement run on a connection that
// pg_terminate_backend ended, the way an operator or a pooler ends it.
func killed(t *testing.T, pool *pgxpool.Pool) error {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	pid := conn.Conn().PgConn().PID()
	if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 10*time.Second, "backend gone", func() bool {
		var n int
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n)
		return n == 0
	})
	_, err = conn.Exec(ctx, "SELECT 1")
	if err == nil {
		t.Fatal("a statement on a terminated connection succeeded")
	}
	return err
}

func TestConnectionLost(t *testing.T) {
	t.Parallel()
	pool, _ := outboxtest.Schema(t)
	if err := killed(t, pool); !pgretry.ConnectionLost(err) {
		t.Fatalf("terminated connection: %v (%T) not classified as lost", err, err)
	}
	_, err := pool.Exec(context.Background(), "SELECT * FROM no_such_table")
	if err == nil || pgretry.ConnectionLost(err) {
		t.Fatalf("a statement's own error (%v) classified as a lost connection", err)
	}
	if pgretry.ConnectionLost(context.DeadlineExceeded) || pgretry.ConnectionLost(nil) {
		t.Fatal("a deadline or no error classified as a lost connection")
	}
}

// TestDoRetriesOnAnotherConnection kills the connection a write runs on:
// Do runs it again on another connection of the pool, and the write, fenced
// by its value, happens once.
func TestDoRetriesOnAnotherConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".marks (id int PRIMARY KEY, token int)"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+schema+".marks VALUES (1, 7)"); err != nil {
		t.Fatal(err)
	}
	var attempts []int
	err := pgretry.Do(ctx, time.Now().Add(10*time.Second), func(ctx context.Context, a pgretry.Attempt) error {
		attempts = append(attempts, a.N)
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		if a.N == 1 {
			if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", conn.Conn().PgConn().PID()); err != nil {
				t.Fatal(err)
			}
			outboxtest.Eventually(t, 10*time.Second, "backend gone", func() bool {
				var n int
				_ = pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", conn.Conn().PgConn().PID()).Scan(&n)
				return n == 0
			})
		}
		_, err = conn.Exec(ctx, "UPDATE "+schema+".marks SET token = NULL WHERE id = 1 AND token = 7")
		return err
	})
	if err != nil {
		t.Fatalf("write not retried to success: %v (attempts %v)", err, attempts)
	}
	if len(attempts) < 2 {
		t.Fatalf("attempts %v: the killed connection was not noticed", attempts)
	}
	var token *int
	if err := pool.QueryRow(ctx, "SELECT token FROM "+schema+".marks WHERE id = 1").Scan(&token); err != nil {
		t.Fatal(err)
	}
	if token != nil {
		t.Fatalf("token %d: the write did not happen", *token)
	}
}

// TestDoStopsAtTheDeadline: past until, the last error is returned.
func TestDoStopsAtTheDeadline(t *testing.T) {
	t.Parallel()
	lost := &pgconnLost{}
	n := 0
	err := pgretry.Do(context.Background(), time.Now().Add(50*time.Millisecond), func(context.Context, pgretry.Attempt) error {
		n++
		return lost
	})
	if !errors.Is(err, lost) || n < 2 {
		t.Fatalf("err %v after %d attempts", err, n)
	}
	err = pgretry.Do(context.Background(), time.Now().Add(time.Second), func(context.Context, pgretry.Attempt) error { return pgx.ErrNoRows })
	if !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("a non-connection error was retried or lost: %v", err)
	}
}

// pgconnLost is a network error, as a dropped connection surfaces.
type pgconnLost struct{}

func (*pgconnLost) Error() string   { return "read tcp: connection reset by peer" }
func (*pgconnLost) Timeout() bool   { return false }
func (*pgconnLost) Temporary() bool { return false }
