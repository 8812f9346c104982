package polyglot_test

import (
	"context"
	"encoding/json"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/outboxamqp"
	"github.com/pgoutbox/outbox/outboxkafka"
)

// The Python consumers' report: inbox_claim's answers, applications out of
// sequence order, attributes that were not as docs/destinations.md
// promises, and the distinct values of the attributes the test knows.
type consumerReport struct {
	Applied         int      `json:"apply"`
	OutOfOrder      int      `json:"out_of_order"`
	Bad             []string `json:"bad"`
	Source          []string `json:"source"`
	Type            []string `json:"type"`
	DataContentType []string `json:"datacontenttype"`
	Traceparent     []string `json:"traceparent"`
}

// source is the CloudEvents source the tests' publishers set.
const source = "/polyglot"

// TestPythonAMQPConsumer: orders written by writer.sql, published by a relay
// to an exchange and a queue of the test's own on RabbitMQ, are applied by
// consumer_amqp.py (python3-pika, python3-psycopg) through the SQL inbox:
// each once, in sequence order, none rolled back, every attribute decoded.
func TestPythonAMQPConsumer(t *testing.T) {
	t.Parallel()
	needPython(t, "pika", "python3-pika")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, schema := outboxtest.Schema(t)
	wrote := writeSQL(t, ctx, schema, 20)

	url := rabbittest.URL()
	ch, err := rabbittest.Conn(t, url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	exchange, queue := rabbittest.UniqueName("polyglot"), rabbittest.UniqueName("polyglot_billing")
	// Bound before the relay publishes: an unroutable message is held (docs/destinations.md).
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "outbox.#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = ch.ExchangeDelete(exchange, false, false)
	})
	pub, err := outboxamqp.NewPublisher(outboxamqp.Config{URL: url, Exchange: exchange, Source: source})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	runRelay(t, ctx, pool, schema, pub)

	env := []string{"DATABASE_URL=" + outboxtest.DatabaseURL(), "OUTBOX_SCHEMA=" + schema, "AMQP_URL=" + url}
	checkConsumer(t, ctx, pool, schema, wrote, run(t, ctx, env, python, "consumer_amqp.py", queue, "billing", "40"))
}

// TestPythonKafkaConsumer: orders written by writer.sql, published by a
// relay to franz-go's in-process kfake cluster (no Kafka server exists
// here; 4 partitions, keyed by aggregate id), are applied by
// consumer_kafka.py (python3-confluent-kafka, python3-psycopg) through the
// SQL inbox: each once, in sequence order, none rolled back, every
// attribute decoded, the record key the partition key.
func TestPythonKafkaConsumer(t *testing.T) {
	t.Parallel()
	needPython(t, "confluent_kafka", "python3-confluent-kafka")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, schema := outboxtest.Schema(t)
	wrote := writeSQL(t, ctx, schema, 20)

	topic, err := outboxkafka.Topic(outboxkafka.TopicDefault, "order")
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	pub, err := outboxkafka.NewPublisher(outboxkafka.Config{Brokers: cluster.ListenAddrs(), Source: source})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	runRelay(t, ctx, pool, schema, pub)

	env := []string{"DATABASE_URL=" + outboxtest.DatabaseURL(), "OUTBOX_SCHEMA=" + schema, "KAFKA_BROKERS=" + cluster.ListenAddrs()[0]}
	checkConsumer(t, ctx, pool, schema, wrote, run(t, ctx, env, python, "consumer_kafka.py", topic, "billing", "40"))
}

// needPython fails the test when Debian's python cannot import module (or
// psycopg), saying which package to install.
func needPython(t *testing.T, module, pkg string) {
	t.Helper()
	for m, p := range map[string]string{module: pkg, "psycopg": "python3-psycopg"} {
		if err := exec.Command(python, "-c", "import "+m).Run(); err != nil {
			t.Fatalf("%s cannot import %s (%v): run .ci/setup, or apt-get install %s", python, m, err, p)
		}
	}
}

// checkConsumer checks a Python consumer's report and the effects it
// committed against what writer.sql committed and rolled back.
func checkConsumer(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string, wrote wroteReport, out []byte) {
	t.Helper()
	var seen consumerReport
	if err := json.Unmarshal(out, &seen); err != nil {
		t.Fatalf("the consumer's report: %v\n%s", err, out)
	}
	if seen.Applied != len(wrote.Written) || seen.OutOfOrder != 0 || len(seen.Bad) != 0 {
		t.Errorf("the consumer: %d applied, %d out of order, attributes not as documented: %v; want %d applied, none out of order, none",
			seen.Applied, seen.OutOfOrder, seen.Bad, len(wrote.Written))
	}
	for _, c := range []struct {
		name      string
		got, want []string
	}{
		{"source", seen.Source, []string{source}},
		{"type", seen.Type, []string{"OrderPaid", "OrderPlaced"}},
		{"datacontenttype", seen.DataContentType, []string{"application/json"}},
		{"traceparent", seen.Traceparent, []string{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("the consumer decoded %s %q, want %q", c.name, c.got, c.want)
		}
	}

	// I4 and I5 in the consumer's own table: each written event's effect
	// once, nothing of a rolled-back transaction.
	rows, err := pool.Query(ctx, `SELECT event_id::text, count(*) FROM `+schema+`.polyglot_effects GROUP BY event_id`)
	if err != nil {
		t.Fatal(err)
	}
	applied := map[string]int{}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { applied[id] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	for _, w := range wrote.Written {
		if id := w[0].(string); applied[id] != 1 {
			t.Errorf("event %s (order %v, sequence %v) applied %d times, want once", id, w[1], w[2], applied[id])
		}
	}
	for _, id := range wrote.RolledBack {
		if applied[id] > 0 {
			t.Errorf("event %s of a rolled-back transaction was applied", id)
		}
	}
	if len(applied) != len(wrote.Written) {
		t.Errorf("%d events applied, %d written", len(applied), len(wrote.Written))
	}
}
