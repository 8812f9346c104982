package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxnats"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// buildOutbox builds the outbox command with -race into a directory of its
// own (binPath), once per test run.
func buildOutbox() {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "outbox-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "outbox")
		out, err := exec.Command("go", "build", "-race", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
}

// outboxBinary returns the outbox command built once per test run (started
// by TestMain when the whole package runs), waiting for the build.
func outboxBinary(t *testing.T) string {
	t.Helper()
	buildOutbox() // waits for a build under way
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// TestRelayCrashBetweenAckAndMark kills the relay process (SIGKILL) after the
// broker acknowledged a batch but before it was marked published. A second
// relay takes the events over when the lease expires and publishes them
// again; the consumer inbox applies every event once (I3, I4) and the
// broker saw each aggregate in order (I5).
func TestRelayCrashBetweenAckAndMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	const aggregates, perAggregate = 5, 4
	for round := 0; round < perAggregate; round++ {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for a := 0; a < aggregates; a++ {
				ev := outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("o%d", a), Type: fmt.Sprintf("Step%d", round), Payload: []byte(`{}`)}
				if _, err := w.InsertTx(ctx, tx, ev); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	stream, prefix := "S_"+outboxtest.UniqueName(t, "c"), outboxtest.UniqueName(t, "c")
	nc, err := nats.Connect(outboxtest.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close) // registered first, so it runs after the stream is deleted
	js, _ := jetstream.New(nc)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })

	relayCmd := func(failpoints string) *exec.Cmd {
		cmd := exec.Command(outboxBinary(t), "relay", "--schema", schema, "--destination", outboxtest.NATSURL(),
			"--nats-stream", stream, "--nats-subject-prefix", prefix,
			// A short dedup window, so that the republished events really
			// reach the stream twice and the inbox has duplicates to drop.
			"--nats-duplicate-window", "100ms",
			"--lease", "1s", "--poll-interval", "50ms", "--retry-min", "50ms")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+outboxtest.DatabaseURL(), "OUTBOX_FAILPOINTS="+failpoints)
		cmd.Stderr = &testWriter{t: t}
		return cmd
	}

	crashing := relayCmd("relay/after-ack-before-mark=crash")
	runCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := crashing.Start(); err != nil {
		t.Fatal(err)
	}
	waitErr := waitCmd(runCtx, crashing)
	var exitErr *exec.ExitError
	if !errors.As(waitErr, &exitErr) || exitErr.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("relay with the crash failpoint ended with %v, want killed by SIGKILL", waitErr)
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := s.Info(ctx)
	var marked, leased int
	if err := pool.QueryRow(ctx, `SELECT count(published_at), count(claim_token) FROM `+schema+`.outbox_events`).Scan(&marked, &leased); err != nil {
		t.Fatal(err)
	}
	// The relay claimed every lane with its successors and published the
	// first wave (each lane's head) before it was killed.
	if info.State.Msgs != aggregates || marked != 0 || leased != aggregates*perAggregate {
		t.Fatalf("after the crash: %d messages at the broker, %d marked, %d leased; want %d acked, none marked, %d still leased",
			info.State.Msgs, marked, leased, aggregates, aggregates*perAggregate)
	}

	recovering := relayCmd("")
	if err := recovering.Start(); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 60*time.Second, "all events published after recovery", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events WHERE published_at IS NULL`).Scan(&n)
		return n == 0
	})
	_ = recovering.Process.Signal(syscall.SIGTERM)
	if err := waitCmd(runCtx, recovering); err != nil {
		t.Fatalf("relay did not shut down cleanly on SIGTERM: %v", err)
	}

	// Consume the whole stream through the inbox.
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.effects (event_id uuid PRIMARY KEY, aggregate_id text, sequence bigint)`); err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "test"})
	if err != nil {
		t.Fatal(err)
	}
	info, _ = s.Info(ctx)
	counts := map[inbox.Outcome]int{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		raw, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		m, err := outboxnats.Decode(raw.Header, raw.Data)
		if err != nil {
			t.Fatal(err)
		}
		out, err := in.Handle(ctx, m, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.effects VALUES ($1, $2, $3)`, m.ID, m.AggregateID, m.Sequence)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if out == inbox.Early {
			t.Fatalf("I5 violated at the broker: %s seq %d arrived before its predecessor", m.AggregateID, m.Sequence)
		}
		counts[out]++
	}
	total := aggregates * perAggregate
	if counts[inbox.Applied] != total || counts[inbox.Duplicate] != aggregates {
		t.Fatalf("inbox outcomes %v; want %d applied and %d duplicates (the republished batch)", counts, total, aggregates)
	}
	var effects int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.effects`).Scan(&effects); err != nil || effects != total {
		t.Fatalf("%d effects (err %v), want %d: each event applied once", effects, err, total)
	}
}

func waitCmd(ctx context.Context, cmd *exec.Cmd) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return ctx.Err()
	}
}

// testWriter sends a child process's stderr to the test log.
type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}
