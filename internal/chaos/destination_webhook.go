package chaos

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/inventory"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

func init() {
	registerDestination(destinationKind{name: "webhook", schemes: []string{"http", "https"}, open: openWebhook})
}

// webhookDestination is an HTTP webhook: the relays POST each event to the
// URL, and the inventory consumer is the endpoint (it serves the URL's
// host, port and path). There is no broker between them, so:
//
//   - one consumer process runs (a webhook has one endpoint; several
//     processes would need a load balancer in front);
//   - there is nothing to restart but the consumer, whose kills are
//     already faults of the schedule: Restartable is false;
//   - Messages is what the endpoint durably accepted. The consumer answers
//     2xx only after its inbox transaction committed, so an event "at the
//     destination" is an event with an inbox row (processed_events), read
//     with the outbox row for its order and sequence, in the order the
//     inbox rows were written. I3 then checks the relay's published marks
//     against what the endpoint accepted: an event marked published that
//     the endpoint never accepted (a mark without a 2xx, or a 2xx without
//     a commit) is a violation. The inbox keeps one row per event, so
//     duplicate posts are not counted here (the consumers' logs count the
//     duplicates they suppressed);
//   - Progress's pending is the relays' backlog, the unpublished events:
//     a webhook has no queue of its own.
//
// A fresh "whsec_" secret signs each run's requests; relays and consumers
// get it in OUTBOX_WEBHOOK_SECRET (Env) and it is never printed.
type webhookDestination struct {
	url    string
	secret string
	pool   *pgxpool.Pool
	schema string
}

func openWebhook(ctx context.Context, cfg DestinationConfig, rawURL string) (Destination, error) {
	if rawURL == "" {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		rawURL = "http://127.0.0.1:" + strconv.Itoa(port) + "/events"
	}
	wcfg, err := outboxwebhook.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if u, err := url.Parse(wcfg.URL); err != nil || u.Scheme != "http" {
		return nil, fmt.Errorf("webhook destination %s: the inventory consumer is the endpoint and serves http:// only", redactQuery(rawURL))
	}
	if cfg.DatabaseURL == "" || cfg.Schema == "" {
		return nil, errors.New("webhook destination: needs the run's database and schema (the endpoint's inbox is what it accepted)")
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	d := &webhookDestination{url: rawURL, secret: "whsec_" + base64.StdEncoding.EncodeToString(key), schema: cfg.Schema}
	if d.pool, err = pgxpool.New(ctx, cfg.DatabaseURL); err != nil {
		return nil, fmt.Errorf("webhook destination: database: %w", err)
	}
	return d, nil
}

func (d *webhookDestination) Name() string { return "webhook" }

func (d *webhookDestination) Describe() string {
	return "webhook: the relays POST to the inventory consumer's HTTP server at " + redactQuery(d.url) +
		" (signed with a secret of the run's own)"
}

// redactQuery drops a URL's query, which may hold an endpoint's token.
func redactQuery(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	u.RawQuery, u.ForceQuery = "", false
	return u.String()
}

func (d *webhookDestination) URL() string { return d.url }

func (d *webhookDestination) Args(string) []string { return nil }

// Env gives relays and consumers the run's signing secret.
func (d *webhookDestination) Env(string) []string {
	return []string{outboxwebhook.EnvSecret + "=" + d.secret}
}

func (d *webhookDestination) MaxConsumers() (int, string) {
	return 1, "a webhook has one endpoint, served by one consumer process"
}

func (d *webhookDestination) NoRestarts() string {
	return "not applicable to a webhook, which has no broker between relay and consumer; the consumer (the endpoint) is killed and restarted instead"
}

func (d *webhookDestination) Restartable() bool { return false }

func (d *webhookDestination) Stop() error { return errNotRestartable(d) }

func (d *webhookDestination) Start(context.Context) error { return nil }

func (d *webhookDestination) Restarts() int { return 0 }

func (d *webhookDestination) table(name string) string {
	return pgx.Identifier{d.schema, name}.Sanitize()
}

// Messages returns the order events the endpoint durably accepted: those
// with an inbox row, in the order the rows were written (each order's in
// sequence order, since the consumer answers an order's event 2xx only
// after committing it and the relay posts the next only after that 2xx).
func (d *webhookDestination) Messages(ctx context.Context) ([]outbox.Message, error) {
	rows, err := d.pool.Query(ctx, `SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.event_type
FROM `+d.table("processed_events")+` p JOIN `+d.table("outbox_events")+` e ON e.event_id = p.event_id
WHERE p.consumer_name = $1 AND e.aggregate_type = $2
ORDER BY p.processed_at, e.aggregate_sequence`, inventory.InboxConsumerDefault, orderevents.AggregateType)
	if err != nil {
		return nil, fmt.Errorf("read what the webhook endpoint accepted: %w", err)
	}
	var out []outbox.Message
	var m outbox.Message
	var id uuid.UUID
	if _, err := pgx.ForEachRow(rows, []any{&id, &m.AggregateType, &m.AggregateID, &m.Sequence, &m.Type}, func() error {
		m.ID = id
		out = append(out, m)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read what the webhook endpoint accepted: %w", err)
	}
	return out, nil
}

// Progress: pending is the relays' backlog (a webhook has no queue);
// deliveries are not counted.
func (d *webhookDestination) Progress(ctx context.Context, _ string) (ConsumerProgress, error) {
	p := ConsumerProgress{Exists: true, Deliveries: -1}
	err := d.pool.QueryRow(ctx, `SELECT count(*) FROM `+d.table("outbox_events")+` WHERE published_at IS NULL`).Scan(&p.Pending)
	return p, err
}

// Close closes the harness's database pool; there is nothing to remove.
func (d *webhookDestination) Close(bool) error {
	d.pool.Close()
	return nil
}
