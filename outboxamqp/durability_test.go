package outboxamqp_test

import (
	"net"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/outboxamqp"
)

// TestCheckDurability: what a RabbitMQ confirm is worth, judged on the
// machine's broker, on queues of the test's own. A quorum queue and a
// durable classic queue (also one with arguments such as a TTL, which the
// check must copy to learn its type) are durable; a transient queue, an
// auto-delete one, one exclusive to another connection, a stream, a queue
// that does not exist, and no queue named at all are not. The check
// changes none of them. Each warning names the setting to change.
func TestCheckDurability(t *testing.T) {
	t.Parallel()
	url := rabbittest.URL()
	setup := rabbittest.Conn(t, url)
	owner := rabbittest.Conn(t, url) // holds the exclusive queue
	type queue struct {
		durable, autoDelete, exclusive bool
		args                           amqp.Table
	}
	queues := map[string]queue{
		"quorum":      {durable: true, args: amqp.Table{"x-queue-type": "quorum"}},
		"quorum-dlx":  {durable: true, args: amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": "dlx", "x-delivery-limit": int32(5)}},
		"classic":     {durable: true},
		"classic-ttl": {durable: true, args: amqp.Table{"x-message-ttl": int32(60000), "x-max-length": int32(1000), "x-dead-letter-exchange": "dlx"}},
		"transient":   {},
		"auto-delete": {durable: true, autoDelete: true},
		"exclusive":   {exclusive: true},
		"stream":      {durable: true, args: amqp.Table{"x-queue-type": "stream"}},
	}
	names := map[string]string{"missing": rabbittest.UniqueName("outboxtest-missing")}
	for k, q := range queues {
		names[k] = rabbittest.UniqueName("outboxtest-" + k)
		conn := setup
		if q.exclusive {
			conn = owner
		}
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare(names[k], q.durable, q.autoDelete, q.exclusive, false, q.args); err != nil {
			t.Fatalf("declare %s: %v", k, err)
		}
		if !q.exclusive {
			name := names[k]
			t.Cleanup(func() {
				ch, err := setup.Channel()
				if err == nil {
					_, _ = ch.QueueDelete(name, false, false, false)
					_ = ch.Close()
				}
			})
		}
	}
	check := func(t *testing.T, queues ...string) outbox.DurabilityReport {
		t.Helper()
		p, err := outboxamqp.NewPublisher(outboxamqp.Config{URL: url, Exchange: rabbittest.UniqueName("outboxtest-x"), CheckQueues: queues})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		rep, err := p.CheckDurability(testCtx(t))
		if err != nil {
			t.Fatalf("CheckDurability: %v", err)
		}
		t.Logf("%+v", rep)
		if rep.Destination != "amqp" || strings.Contains(rep.Summary, "\n") {
			t.Errorf("report %+v: want destination amqp and one line", rep)
		}
		return rep
	}
	cases := []struct {
		name    string
		queues  []string
		durable bool
		reason  string
		fix     string
	}{
		{"quorum", []string{"quorum", "quorum-dlx"}, true, "quorum_queues", "quorum queue"},
		{"classic", []string{"classic", "classic-ttl", "quorum"}, true, "durable_queues", "durable classic queue"},
		{"transient", []string{"quorum", "transient"}, false, "queue_not_durable", "declare it durable"},
		{"auto-delete", []string{"auto-delete"}, false, "queue_auto_delete", "without auto-delete"},
		{"exclusive", []string{"exclusive"}, false, "queue_exclusive", "quorum queue"},
		{"stream", []string{"stream"}, false, "stream_queue", "quorum queue"},
		{"missing", []string{"missing", "transient"}, false, "queue_missing", "also not durable: "},
		{"none named", nil, false, "queues_unchecked", "check_queues="},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var qs []string
			for _, k := range c.queues {
				qs = append(qs, names[k])
			}
			rep := check(t, qs...)
			if rep.Durable != c.durable || rep.Reason != c.reason {
				t.Fatalf("durable %v reason %q, want %v %q", rep.Durable, rep.Reason, c.durable, c.reason)
			}
			if !strings.Contains(rep.Summary, c.fix) {
				t.Errorf("summary %q does not say %q", rep.Summary, c.fix)
			}
		})
	}
	t.Run("queues unchanged", func(t *testing.T) {
		t.Parallel()
		check(t, names["classic-ttl"], names["transient"], names["missing"])
		ch, err := setup.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		// The same declarations as at the start still match...
		for _, k := range []string{"classic-ttl", "transient"} {
			q := queues[k]
			if _, err := ch.QueueDeclare(names[k], q.durable, q.autoDelete, false, false, q.args); err != nil {
				t.Fatalf("queue %s changed by the check: %v", k, err)
			}
		}
		// ...and the check created nothing.
		if _, err := ch.QueueDeclarePassive(names["missing"], true, false, false, false, nil); err == nil {
			t.Error("the check created the missing queue")
		}
	})
}

// TestCheckDurabilityUnreachable: a broker that cannot be asked is an error
// marked unavailable (the relay tries again), not a report.
func TestCheckDurabilityUnreachable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := l.Addr().String()
	l.Close()
	p, err := outboxamqp.NewPublisher(outboxamqp.Config{URL: "amqp://guest:guest@" + free + "/", DialTimeout: time.Second, CheckQueues: []string{"q"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.CheckDurability(testCtx(t)); !outbox.IsUnavailable(err) {
		t.Fatalf("CheckDurability on a free port: %v, want unavailable", err)
	}
}
