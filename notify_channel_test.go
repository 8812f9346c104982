package outbox_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestNotifyChannelFitsIdentifierLimit: the channel name keeps its historic
// form when it fits PostgreSQL's 63-byte limit, and is a deterministic
// 63-byte name, distinct per schema, when it does not.
func TestNotifyChannelFitsIdentifierLimit(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"outbox", "a", strings.Repeat("s", 49)} {
		if got, want := outbox.NotifyChannel(s), "outbox_events_"+s; got != want {
			t.Errorf("NotifyChannel(%q) = %q, want %q (unchanged for names that fit)", s, got, want)
		}
	}
	seen := map[string]string{}
	base := strings.Repeat("x", 40)
	for _, s := range []string{
		strings.Repeat("s", 50), strings.Repeat("s", 63),
		base + strings.Repeat("a", 23), base + strings.Repeat("a", 22) + "b", // same first 62 bytes
		base + "_1" + strings.Repeat("z", 21), base + "_2" + strings.Repeat("z", 21),
	} {
		c := outbox.NotifyChannel(s)
		if len(c) > 63 {
			t.Errorf("NotifyChannel(%q) = %q: %d bytes, over PostgreSQL's 63", s, c, len(c))
		}
		if !strings.HasPrefix(c, "outbox_events_"+s[:32]) {
			t.Errorf("NotifyChannel(%q) = %q: want it to start with the schema's first 32 bytes", s, c)
		}
		if c != outbox.NotifyChannel(s) {
			t.Errorf("NotifyChannel(%q) is not deterministic", s)
		}
		if other, dup := seen[c]; dup {
			t.Errorf("schemas %q and %q share channel %q", s, other, c)
		}
		seen[c] = s
	}
}

// claimCounter counts a relay's claims.
type claimCounter struct{ n atomic.Int64 }

func (c *claimCounter) ObserveClaim(outbox.ClaimObservation) { c.n.Add(1) }

// TestNotifyWakesRelayOfLongSchema: with a 63-byte schema name (past the
// length where "outbox_events_<schema>" fits an identifier), the writer's,
// the Notifier's and the relay's channel still meet: a listener receives the
// writer's notification on the schema's channel, and a relay that would not
// poll for an hour publishes an event as soon as it is notified.
func TestNotifyWakesRelayOfLongSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := outboxtest.UniqueName(t, "t")
	name += strings.Repeat("x", 63-len(name))
	pool, schema := outboxtest.SchemaNamed(t, name)
	w := newWriter(t, schema)
	channel := outbox.NotifyChannel(schema)

	// A listener of the test's own sees the writer's notification.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if err := w.Notify(ctx, pool); err != nil {
		t.Fatalf("writer notify on schema %s: %v", schema, err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := conn.Conn().WaitForNotification(waitCtx)
	if err != nil {
		t.Fatalf("no notification on %s: %v", channel, err)
	}
	if n.Channel != channel {
		t.Fatalf("notification on channel %q, want %q", n.Channel, channel)
	}

	// A relay polling once an hour is woken by the Notifier.
	b := newNATS(t, outboxtest.NATSURL(), 0)
	claims := &claimCounter{}
	cfg := quietConfig(schema, b.pub)
	cfg.PollInterval = time.Hour
	cfg.Observer = claims
	r, _ := startRelay(t, pool, cfg)
	// Its first claim at start, and the one after its LISTEN took effect
	// (the only wake-up source left): after both it idles for an hour.
	outboxtest.Eventually(t, 10*time.Second, "relay claimed after its LISTEN", func() bool { return claims.n.Load() >= 2 })
	notifier, err := outbox.NewNotifier(pool, outbox.NotifierConfig{Schema: schema, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer notifier.Close()
	writeEvents(t, pool, w, 1, 1)
	notifier.Notify()
	outboxtest.Eventually(t, 10*time.Second, "event published after the wake-up", func() bool { return r.Stats().Published == 1 })
	if st := notifier.Stats(); st.Failed != 0 {
		t.Fatalf("notifier stats %+v: a NOTIFY failed", st)
	}
}
