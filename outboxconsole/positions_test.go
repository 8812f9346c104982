package outboxconsole_test

import (
	"fmt"
	"html"
	"net/http"
	"net/url"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/operatortest"
	"github.com/pgoutbox/outbox/outboxconsole"
)

// consoleOperator acts through the console's retry and skip forms, logged
// in; a refusal must be a 409 whose page says why.
type consoleOperator struct {
	t *testing.T
	c *client
}

func (o consoleOperator) post(path string, form url.Values) error {
	o.t.Helper()
	form.Set("csrf", o.c.csrf)
	code, body := o.c.do(http.MethodPost, path, form, nil)
	switch code {
	case http.StatusSeeOther:
		return nil
	case http.StatusConflict:
		return fmt.Errorf("%d: %s", code, html.UnescapeString(body))
	}
	o.t.Fatalf("POST %s: %d %s; want 303, or 409 for a refusal", path, code, body)
	return nil
}

func (o consoleOperator) Retry(id uuid.UUID) error {
	return o.post("/quarantine/retry", url.Values{"event_id": {id.String()}})
}

func (o consoleOperator) Skip(id uuid.UUID, reason string) error {
	return o.post("/quarantine/skip", url.Values{"event_id": {id.String()}, "reason": {reason}})
}

// TestConsoleSkipAndRetryAtAnyPosition is the regression test of issue 19,
// item 2, through the console: a skip of a quarantined event behind an
// unsettled one is answered 409 with a page naming that event, and no event
// reaches the destination before an earlier one. See
// operatortest.LanePositions.
func TestConsoleSkipAndRetryAtAnyPosition(t *testing.T) {
	t.Parallel()
	operatortest.LanePositions(t, func(t *testing.T, pool *pgxpool.Pool, schema string) operatortest.Operator {
		c := newClient(t, serve(t, outboxconsole.Config{Pool: pool, Schema: schema, Token: testToken}))
		c.login("alice")
		return consoleOperator{t: t, c: c}
	})
}
