package chaos

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestWaitWritesEndedWaitsForAnOpenTransaction: a transaction of the API's
// application_name begun before since holds the checks back until it ends,
// as a cancelled request's COMMIT still on its way must (a create judged
// rolled back by Resolve, then committed: CI of 7 December 2026).
func TestWaitWritesEndedWaitsForAnOpenTransaction(t *testing.T) {
	pool, schema := outboxtest.Schema(t)
	ctx := context.Background()
	app := NewSystem(SystemConfig{Schema: schema}).AppName(RoleAPI)
	cfg, err := pgx.ParseConfig(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = app
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	var since time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&since); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = WaitWritesEnded(short, pool, app, since)
	cancel()
	if err == nil || !errors.Is(short.Err(), context.DeadlineExceeded) {
		t.Fatalf("WaitWritesEnded returned %v while a transaction begun before since was open", err)
	}
	// Another application's open transaction does not hold it back.
	if err := WaitWritesEnded(ctx, pool, app+"-other", since); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- WaitWritesEnded(ctx, pool, app, since) }()
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("after the commit: %v", err)
	}
}
