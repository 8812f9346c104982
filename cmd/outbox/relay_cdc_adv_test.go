package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/pgcluster"
	"github.com/pgoutbox/outbox/outboxcdc"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// TestAdvRelayCDCRestartWithTheSameIDPublishesWhatItHadClaimed: an operator
// names relays (--id or OUTBOX_RELAY_ID: a pod name, a systemd unit), so a
// relay restarted after a crash has the ID it had. `outbox relay --mode
// cdc` is killed (SIGKILL) after its stream's claim, before anything
// reached the destination, and restarted with the same --id. The design
// promises "a relay killed anywhere restarts from a position at or before
// the first transaction it had not finished, and reads it again", and
// docs/operations.md (Recovery) that what it had not published is
// published again "by the stream once their lease expired (it keeps them
// waiting up to a minute)". The safety net is an hour away, so only the
// stream can publish the events: it must, once the dead process's 5 s
// lease is over.
//
// The restarted stream finds the rows leased by its own name with a live
// lease, takes them for "acknowledged, being marked in the background"
// (stateSQL), finishes them and confirms the slot past them: they are
// never published by the stream.
func TestAdvRelayCDCRestartWithTheSameIDPublishesWhatItHadClaimed(t *testing.T) {
	t.Parallel()
	c := outboxtest.PrivateCluster(t, pgcluster.Config{Settings: map[string]string{"wal_level": "logical", "max_replication_slots": "10", "max_wal_senders": "10"}})
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, c.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	const schema = "cdc_same_id"
	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if err := outboxcdc.Setup(ctx, outboxcdc.Config{Pool: pool, Schema: schema}); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	const aggregates = 3
	var lsn string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for a := 0; a < aggregates; a++ {
			ev := outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("o%d", a), Type: "Placed", Payload: []byte(`{}`)}
			if _, err := w.InsertTx(ctx, tx, ev); err != nil {
				return err
			}
		}
		return tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn)
	})
	if err != nil {
		t.Fatal(err)
	}
	last, _ := pglogrepl.ParseLSN(lsn)
	confirmed := func() pglogrepl.LSN {
		var s string
		if err := pool.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
			outboxcdc.SlotName(schema, outboxcdc.GroupDefault)).Scan(&s); err != nil {
			t.Fatal(err)
		}
		l, _ := pglogrepl.ParseLSN(s)
		return l
	}
	unpublished := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events WHERE published_at IS NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	stream, prefix := "S_"+outboxtest.UniqueName(t, "sid"), outboxtest.UniqueName(t, "sid")
	nc, err := nats.Connect(outboxtest.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	relayCmd := func(failpoints string) *exec.Cmd {
		cmd := exec.Command(outboxBinary(t), "relay", "--mode", "cdc", "--reconcile-after", "1h", "--id", "orders-relay-0",
			"--schema", schema, "--destination", outboxtest.NATSURL(),
			"--nats-stream", stream, "--nats-subject-prefix", prefix, "--nats-duplicate-window", "100ms",
			"--lease", "5s", "--poll-interval", "50ms", "--retry-min", "50ms")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+c.URL(""), "OUTBOX_FAILPOINTS="+failpoints)
		cmd.Stderr = &testWriter{t: t}
		return cmd
	}
	runCtx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()
	killed := relayCmd("relay/before-publish=crash")
	if err := killed.Start(); err != nil {
		t.Fatal(err)
	}
	waitErr := waitCmd(runCtx, killed)
	var exitErr *exec.ExitError
	if !errors.As(waitErr, &exitErr) || exitErr.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("relay with the crash failpoint ended with %v, want killed by SIGKILL", waitErr)
	}
	if n := unpublished(); n != aggregates {
		t.Fatalf("%d unpublished after the crash before publishing, want %d", n, aggregates)
	}

	restarted := relayCmd("")
	if err := restarted.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = restarted.Process.Signal(syscall.SIGTERM)
		_ = waitCmd(runCtx, restarted)
	}()
	// The slot's position is read before the table: the relay confirms
	// once its marks are written, so a confirmation past the events is a
	// violation only if some are still unpublished after it.
	deadline := time.Now().Add(45 * time.Second)
	for {
		got := confirmed()
		n := unpublished()
		if n == 0 {
			break
		}
		if got > last {
			t.Fatalf("the restarted relay confirmed the slot at %s, past the commit of %d events it never published (nothing else publishes them: the safety net is an hour away)",
				got, n)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events the killed relay had claimed are still unpublished 45 s after the restart with the same --id (lease 5 s)", unpublished())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
