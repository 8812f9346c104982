package outboxkafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxkafka"
)

// TestOneRefusedRecordQuarantinesItAlone (issue 19, item 5): the topic's
// max.message.bytes is below one record, which the publisher's
// MaxRecordBytes allows, so only the broker refuses it. The broker refuses
// the whole record batch it is in and the client fails every record buffered
// behind it in the partition with the same MESSAGE_TOO_LARGE. Only the
// refused record's event is quarantined (its aggregate's later event waits
// behind it); the other aggregates' events of the same call are published,
// in order, without an attempt spent.
func TestOneRefusedRecordQuarantinesItAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	const topic = "outbox.order"
	adm, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	// One partition: every record of the call shares its batches.
	limit := "8000"
	if _, err := kadm.NewClient(adm).CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": &limit}, topic); err != nil {
		t.Fatal(err)
	}
	p := publisher(t, c, outboxkafka.Config{MaxRecordBytes: 64 << 10})

	pool, schema := outboxtest.Schema(t)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	noise := make([]byte, 4500)
	if _, err := rand.Read(noise); err != nil {
		t.Fatal(err)
	}
	big := `{"pad":"` + hex.EncodeToString(noise) + `"}` // 9,000 bytes that do not compress
	const aggregates = 6
	var bigID string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for seq := 1; seq <= 3; seq++ {
			for a := 0; a < aggregates; a++ {
				payload := `{"n":` + strconv.Itoa(seq) + `}`
				if a == 2 && seq == 2 {
					payload = big
				}
				recs, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "agg-" + strconv.Itoa(a),
					Type: "Step", Payload: []byte(payload)})
				if err != nil {
					return err
				}
				if a == 2 && seq == 2 {
					bigID = recs[0].ID.String()
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: schema, Publisher: p, PollInterval: 20 * time.Millisecond,
		Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// Everything but agg-2 #2 (refused) and #3 (behind it) is published.
	for deadline := time.Now().Add(30 * time.Second); ; {
		var left, quarantined int
		if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE published_at IS NULL), count(quarantined_at) FROM `+schema+`.outbox_events`).
			Scan(&left, &quarantined); err != nil {
			t.Fatal(err)
		}
		if left == 2 && quarantined == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s: %d events unpublished, %d quarantined; want 2 unpublished (the refused one and the one behind it), 1 quarantined",
				left, quarantined)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rows, err := pool.Query(ctx, `SELECT event_id::text, aggregate_id, aggregate_sequence, attempt_count, quarantined_at IS NOT NULL, published_at IS NOT NULL
		FROM `+schema+`.outbox_events ORDER BY aggregate_id, aggregate_sequence`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, agg string
		var seq int64
		var attempts int
		var quarantined, published bool
		if err := rows.Scan(&id, &agg, &seq, &attempts, &quarantined, &published); err != nil {
			t.Fatal(err)
		}
		switch {
		case id == bigID:
			if !quarantined || attempts != 1 {
				t.Errorf("the refused event: quarantined %t, %d attempts; want quarantined after 1", quarantined, attempts)
			}
		case agg == "agg-2" && seq == 3:
			if published || quarantined || attempts != 0 {
				t.Errorf("agg-2 #3 (behind the refused event): published %t, quarantined %t, %d attempts; want waiting untouched", published, quarantined, attempts)
			}
		default:
			if !published || quarantined || attempts != 0 {
				t.Errorf("%s #%d: published %t, quarantined %t, %d attempts; want published without an attempt spent", agg, seq, published, quarantined, attempts)
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	// At the broker: each aggregate's events once, in order, the refused
	// one absent.
	recs := consume(t, c, aggregates*3-2, topic)
	last := map[string]int64{}
	for _, rec := range recs {
		m, err := outboxkafka.Decode(rec)
		if err != nil {
			t.Fatal(err)
		}
		if m.ID.String() == bigID {
			t.Fatalf("the refused record is at the broker")
		}
		if m.Sequence != last[m.AggregateID]+1 {
			t.Fatalf("%s: #%d at the broker after #%d", m.AggregateID, m.Sequence, last[m.AggregateID])
		}
		last[m.AggregateID] = m.Sequence
	}
}

// quiet is a logger that drops everything.
func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
