package main

import (
	"errors"
	"regexp"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox/internal/rabbittest"
)

// TestDemoAMQP runs "outbox demo --destination amqp": the relay publishes
// to an exchange of the run's own on the machine's RabbitMQ, the inventory
// consumer reads the queue bound to it, the checker reads every event from
// the witness queue; dropped acks make the inbox suppress redeliveries,
// every invariant holds, and the exchange, the queues and the schema are
// removed at the end.
func TestDemoAMQP(t *testing.T) {
	report, schema, _ := runDemoTest(t, "--orders", "60", "--destination", "amqp", "--lost-acks", "0.2")
	m := regexp.MustCompile(`destination: RabbitMQ at amqp://guest:xxxxx@127\.0\.0\.1:5672/, exchange (demo_[a-z0-9]+), queue (demo_[a-z0-9]+\.inventory) \(witness (demo_[a-z0-9]+\.witness)\)`).FindStringSubmatch(report)
	if m == nil {
		t.Fatal("the report does not say it ran on the machine's RabbitMQ (password hidden) and name the exchange and the queues")
	}
	if m := regexp.MustCompile(`(?m)^duplicates suppressed\s+(\d+)`).FindStringSubmatch(report); m == nil || m[1] == "0" {
		t.Error("no redelivery was suppressed by the inbox")
	}
	if schemaExists(t, schema) {
		t.Errorf("schema %s was not dropped", schema)
	}
	conn := rabbittest.Conn(t, rabbittest.URL())
	for _, q := range m[2:] {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		_, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if ae := (*amqp.Error)(nil); !errors.As(err, &ae) || ae.Code != amqp.NotFound {
			t.Errorf("queue %s: %v; want it deleted", q, err)
		}
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	err = ch.ExchangeDeclarePassive(m[1], amqp.ExchangeTopic, true, false, false, false, nil)
	if ae := (*amqp.Error)(nil); !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		t.Errorf("exchange %s: %v; want it deleted", m[1], err)
	}
}
