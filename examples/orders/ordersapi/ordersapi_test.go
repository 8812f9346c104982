package ordersapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/examples/orders/ordersapi"
	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

type env struct {
	t      testing.TB
	svc    *ordersapi.Service
	srv    *httptest.Server
	pool   *pgxpool.Pool
	schema string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	pool, schema := outboxtest.Schema(t)
	svc, err := ordersapi.New(pool, ordersapi.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	return &env{t: t, svc: svc, srv: srv, pool: pool, schema: schema}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request; headers are "Name: value" strings.
func (e *env) do(method, path, body string, headers ...string) response {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(k, strings.TrimSpace(v))
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

func (e *env) order(r response, status int) ordersapi.Order {
	e.t.Helper()
	if r.status != status {
		e.t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		e.t.Fatalf("Content-Type %q", ct)
	}
	var o ordersapi.Order
	if err := json.Unmarshal(r.body, &o); err != nil {
		e.t.Fatalf("decode order %s: %v", r.body, err)
	}
	return o
}

// problem checks that r is an RFC 9457 problem with the given status and
// type suffix.
func (e *env) problem(r response, status int, typ string) ordersapi.Problem {
	e.t.Helper()
	if r.status != status {
		e.t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		e.t.Fatalf("Content-Type %q, want application/problem+json (%s)", ct, r.body)
	}
	var p ordersapi.Problem
	if err := json.Unmarshal(r.body, &p); err != nil {
		e.t.Fatalf("decode problem %s: %v", r.body, err)
	}
	if p.Type != ordersapi.ProblemTypeBase+typ || p.Status != status || p.Title == "" || p.Detail == "" {
		e.t.Fatalf("problem %+v, want type %s, status %d, a title and a detail", p, typ, status)
	}
	return p
}

// table is a schema-qualified table name.
func (e *env) table(name string) string { return pgx.Identifier{e.schema, name}.Sanitize() }

// written counts the rows the API and the outbox hold.
func (e *env) written() (orders, items, events, keys, aggregates int) {
	e.t.Helper()
	err := e.pool.QueryRow(context.Background(), `SELECT
	(SELECT count(*) FROM `+e.table("orders")+`),
	(SELECT count(*) FROM `+e.table("order_items")+`),
	(SELECT count(*) FROM `+e.table("outbox_events")+`),
	(SELECT count(*) FROM `+e.table("order_idempotency_keys")+`),
	(SELECT count(*) FROM `+e.table("outbox_aggregates")+`)`).Scan(&orders, &items, &events, &keys, &aggregates)
	if err != nil {
		e.t.Fatal(err)
	}
	return
}

func (e *env) nothingWritten() {
	e.t.Helper()
	if o, i, ev, k, a := e.written(); o+i+ev+k+a != 0 {
		e.t.Fatalf("rows left behind: %d orders, %d items, %d events, %d idempotency keys, %d aggregate counters", o, i, ev, k, a)
	}
}

type eventRow struct {
	Type     string
	Sequence int64
	Payload  []byte
}

func (e *env) events(orderID string) []eventRow {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT event_type, aggregate_sequence, payload_bytes FROM `+e.table("outbox_events")+`
WHERE aggregate_type = $1 AND aggregate_id = $2 ORDER BY aggregate_sequence`, orderevents.AggregateType, orderID)
	if err != nil {
		e.t.Fatal(err)
	}
	evs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[eventRow])
	if err != nil {
		e.t.Fatal(err)
	}
	return evs
}

const validBody = `{"customer_id": "c-1", "items": [{"sku": "SKU-1001", "quantity": 2}, {"sku": "SKU-1003", "quantity": 1}]}`

func TestCreateOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.do("POST", "/orders", validBody)
	o := e.order(r, http.StatusCreated)
	if o.ID == "" || o.CustomerID != "c-1" || o.Status != ordersapi.StatusCreated || len(o.Items) != 2 || o.CreatedAt.IsZero() {
		t.Fatalf("created order %+v", o)
	}
	if loc := r.header.Get("Location"); loc != "/orders/"+o.ID {
		t.Fatalf("Location %q", loc)
	}
	got := e.order(e.do("GET", "/orders/"+o.ID, ""), http.StatusOK)
	if got.ID != o.ID || got.Status != o.Status || len(got.Items) != 2 || got.Items[0] != o.Items[0] || got.Items[1] != o.Items[1] ||
		!got.CreatedAt.Equal(o.CreatedAt) {
		t.Fatalf("GET returned %+v, created %+v", got, o)
	}
	evs := e.events(o.ID)
	if len(evs) != 1 || evs[0].Type != orderevents.OrderCreated || evs[0].Sequence != 1 {
		t.Fatalf("events %+v", evs)
	}
	var p orderevents.OrderCreatedPayload
	if err := json.Unmarshal(evs[0].Payload, &p); err != nil {
		t.Fatal(err)
	}
	if p.OrderID != o.ID || p.CustomerID != "c-1" || len(p.Items) != 2 || p.Items[0] != (orderevents.Item{SKU: "SKU-1001", Quantity: 2}) {
		t.Fatalf("payload %+v", p)
	}
	if s := e.svc.Stats(); s.Created != 1 || s.RolledBack != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	first := e.order(e.do("POST", "/orders", validBody, "Idempotency-Key: k-1"), http.StatusCreated)

	// The same request again, and the same content formatted differently.
	for _, body := range []string{validBody,
		`{"items":[{"quantity":2,"sku":"SKU-1001"},{"sku":"SKU-1003","quantity":1}],"customer_id":"c-1"}`} {
		r := e.do("POST", "/orders", body, "Idempotency-Key: k-1")
		again := e.order(r, http.StatusOK)
		if again.ID != first.ID || r.header.Get(ordersapi.HeaderIdempotentReplayed) != "true" {
			t.Fatalf("replay answered order %s (replayed header %q), want %s", again.ID, r.header.Get(ordersapi.HeaderIdempotentReplayed), first.ID)
		}
	}
	// The same key with another request is refused.
	p := e.problem(e.do("POST", "/orders", `{"customer_id": "c-1", "items": [{"sku": "SKU-1001", "quantity": 3}]}`, "Idempotency-Key: k-1"),
		http.StatusUnprocessableEntity, "idempotency-key-reused")
	if !strings.Contains(p.Detail, "k-1") {
		t.Fatalf("detail %q", p.Detail)
	}
	if o, _, ev, k, _ := e.written(); o != 1 || ev != 1 || k != 1 {
		t.Fatalf("%d orders, %d events, %d keys; want 1 each", o, ev, k)
	}
	// Another key is another order.
	other := e.order(e.do("POST", "/orders", validBody, "Idempotency-Key: k-2"), http.StatusCreated)
	if other.ID == first.ID {
		t.Fatal("a new key returned the old order")
	}
	if s := e.svc.Stats(); s.Created != 2 || s.Replayed != 2 || s.Refused != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestIdempotencyKeyConcurrent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 8
	var wg sync.WaitGroup
	results := make([]response, n)
	for i := range n {
		wg.Go(func() { results[i] = e.do("POST", "/orders", validBody, "Idempotency-Key: same") })
	}
	wg.Wait()
	created, ids := 0, map[string]bool{}
	for _, r := range results {
		switch r.status {
		case http.StatusCreated:
			created++
			ids[e.order(r, http.StatusCreated).ID] = true
		case http.StatusOK:
			ids[e.order(r, http.StatusOK).ID] = true
		default:
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	}
	if created != 1 || len(ids) != 1 {
		t.Fatalf("%d requests created an order, %d distinct ids; want 1 and 1", created, len(ids))
	}
	if o, _, ev, k, _ := e.written(); o != 1 || ev != 1 || k != 1 {
		t.Fatalf("%d orders, %d events, %d keys; want 1 each", o, ev, k)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	o := e.order(e.do("POST", "/orders", validBody), http.StatusCreated)
	c := e.order(e.do("POST", "/orders/"+o.ID+"/cancel", ""), http.StatusOK)
	if c.ID != o.ID || c.Status != ordersapi.StatusCancelled || c.CancelledAt == nil {
		t.Fatalf("cancelled order %+v", c)
	}
	e.problem(e.do("POST", "/orders/"+o.ID+"/cancel", ""), http.StatusConflict, "order-not-cancellable")
	evs := e.events(o.ID)
	if len(evs) != 2 || evs[0].Type != orderevents.OrderCreated || evs[1].Type != orderevents.OrderCancelled || evs[1].Sequence != 2 {
		t.Fatalf("events %+v", evs)
	}
	var p orderevents.OrderCancelledPayload
	if err := json.Unmarshal(evs[1].Payload, &p); err != nil || p.OrderID != o.ID || p.CustomerID != "c-1" || p.CancelledAt.IsZero() {
		t.Fatalf("payload %+v (%v)", p, err)
	}
	if got := e.order(e.do("GET", "/orders/"+o.ID, ""), http.StatusOK); got.Status != ordersapi.StatusCancelled {
		t.Fatalf("GET after cancel: %+v", got)
	}
	if s := e.svc.Stats(); s.Cancelled != 1 || s.Refused != 1 || s.RolledBack != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestCancelConcurrent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	o := e.order(e.do("POST", "/orders", validBody), http.StatusCreated)
	const n = 6
	var wg sync.WaitGroup
	statuses := make([]int, n)
	for i := range n {
		wg.Go(func() { statuses[i] = e.do("POST", "/orders/"+o.ID+"/cancel", "").status })
	}
	wg.Wait()
	ok := 0
	for _, s := range statuses {
		switch s {
		case http.StatusOK:
			ok++
		case http.StatusConflict:
		default:
			t.Fatalf("status %d", s)
		}
	}
	if ok != 1 || len(e.events(o.ID)) != 2 {
		t.Fatalf("%d cancels succeeded, %d events; want 1 and 2", ok, len(e.events(o.ID)))
	}
}

func TestUnknownOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.problem(e.do("GET", "/orders/no-such-order", ""), http.StatusNotFound, "order-not-found")
	e.problem(e.do("POST", "/orders/no-such-order/cancel", ""), http.StatusNotFound, "order-not-found")
	e.problem(e.do("GET", "/orders/"+strings.Repeat("x", 500), ""), http.StatusNotFound, "order-not-found")
	e.nothingWritten()
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cases := []struct {
		name, body string
		headers    []string
		status     int
		typ        string
	}{
		{"malformed JSON", `{"customer_id": "c-1", "items": [`, nil, 400, "malformed-request"},
		{"not an object", `[1, 2]`, nil, 400, "malformed-request"},
		{"empty body", ``, nil, 400, "malformed-request"},
		{"trailing data", validBody + ` {}`, nil, 400, "malformed-request"},
		{"unknown field", `{"customer_id": "c-1", "items": [{"sku": "SKU-1001", "quantity": 1}], "coupon": "X"}`, nil, 400, "malformed-request"},
		{"unknown item field", `{"customer_id": "c-1", "items": [{"sku": "SKU-1001", "quantity": 1, "price": 3}]}`, nil, 400, "malformed-request"},
		{"quantity as string", `{"customer_id": "c-1", "items": [{"sku": "SKU-1001", "quantity": "2"}]}`, nil, 400, "malformed-request"},
		{"fractional quantity", `{"customer_id": "c-1", "items": [{"sku": "SKU-1001", "quantity": 1.5}]}`, nil, 400, "malformed-request"},
		{"empty idempotency key", validBody, []string{"Idempotency-Key: "}, 400, "malformed-request"},
		{"wrong content type", validBody, []string{"Content-Type: text/plain"}, 415, "unsupported-media-type"},
		{"null", `null`, nil, 422, "validation-failed"},
		{"no items", `{"customer_id": "c-1", "items": []}`, nil, 422, "validation-failed"},
		{"items missing", `{"customer_id": "c-1"}`, nil, 422, "validation-failed"},
		{"no customer", `{"items": [{"sku": "SKU-1001", "quantity": 1}]}`, nil, 422, "validation-failed"},
		{"zero quantity", `{"customer_id": "c-1", "items": [{"sku": "SKU-1001", "quantity": 0}]}`, nil, 422, "validation-failed"},
		{"negative quantity", `{"customer_id": "c-1", "items": [{"sku": "SKU-1001", "quantity": -3}]}`, nil, 422, "validation-failed"},
		{"huge quantity", `{"customer_id": "c-1", "items": [{"sku": "SKU-1001", "quantity": 1000000}]}`, nil, 422, "validation-failed"},
		{"empty sku", `{"customer_id": "c-1", "items": [{"sku": "", "quantity": 1}]}`, nil, 422, "validation-failed"},
		{"sku twice", `{"customer_id": "c-1", "items": [{"sku": "SKU-1001", "quantity": 1}, {"sku": "SKU-1001", "quantity": 2}]}`, nil, 422, "validation-failed"},
		{"idempotency key too long", validBody, []string{"Idempotency-Key: " + strings.Repeat("k", 300)}, 422, "validation-failed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.t = t
			e.problem(e.do("POST", "/orders", c.body, c.headers...), c.status, c.typ)
		})
	}
	e.t = t
	// Several problems at once are all listed.
	p := e.problem(e.do("POST", "/orders", `{"items": [{"sku": "SKU-1001", "quantity": 0}]}`), 422, "validation-failed")
	if len(p.Errors) != 2 {
		t.Fatalf("errors %q, want 2", p.Errors)
	}
	big := `{"customer_id": "` + strings.Repeat("x", ordersapi.MaxBodyBytes) + `", "items": []}`
	e.problem(e.do("POST", "/orders", big), http.StatusRequestEntityTooLarge, "too-large")
	e.nothingWritten()
	if s := e.svc.Stats(); s.Created != 0 || s.RolledBack != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestUnknownSKURollsBack: the order row and its event are written before
// the items' foreign key fails, and the rollback takes all of it away (I2).
func TestUnknownSKURollsBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	body := `{"customer_id": "c-1", "items": [{"sku": "SKU-1001", "quantity": 1}, {"sku": "NOPE-1", "quantity": 1}]}`
	p := e.problem(e.do("POST", "/orders", body, "Idempotency-Key: k-rb"), http.StatusUnprocessableEntity, "unknown-sku")
	if !strings.Contains(p.Detail, "NOPE-1") {
		t.Fatalf("detail %q does not name the SKU", p.Detail)
	}
	e.nothingWritten()
	if s := e.svc.Stats(); s.RolledBack != 1 || s.Created != 0 {
		t.Fatalf("stats %+v: want one transaction that wrote and rolled back", s)
	}
	// The rolled-back request did not use up its idempotency key.
	o := e.order(e.do("POST", "/orders", validBody, "Idempotency-Key: k-rb"), http.StatusCreated)
	if evs := e.events(o.ID); len(evs) != 1 || evs[0].Sequence != 1 {
		t.Fatalf("events after the rollback %+v", evs)
	}
}

// TestFailpoints is not parallel: failpoints are process-wide.
func TestFailpoints(t *testing.T) {
	e := newEnv(t)
	t.Cleanup(func() { _ = failpoint.Enable("", 0) })
	enable := func(spec string) {
		t.Helper()
		if err := failpoint.Enable(spec, 1); err != nil {
			t.Fatal(err)
		}
	}

	// An error just before commit rolls the create back.
	enable(ordersapi.FailpointBeforeCommit + "=error")
	e.problem(e.do("POST", "/orders", validBody, "Idempotency-Key: fp-1"), http.StatusInternalServerError, "internal")
	e.nothingWritten()

	// An error after commit: the client gets a 500, but the order and its
	// event committed; the retry with the same key finds the order.
	enable(ordersapi.FailpointAfterCommitBeforeResponse + "=error")
	e.problem(e.do("POST", "/orders", validBody, "Idempotency-Key: fp-1"), http.StatusInternalServerError, "internal")
	enable("")
	r := e.do("POST", "/orders", validBody, "Idempotency-Key: fp-1")
	o := e.order(r, http.StatusOK)
	if len(e.events(o.ID)) != 1 {
		t.Fatalf("events %+v", e.events(o.ID))
	}

	// A cancel rolled back before commit leaves the order as it was.
	enable(ordersapi.FailpointBeforeCommit + "=error")
	e.problem(e.do("POST", "/orders/"+o.ID+"/cancel", ""), http.StatusInternalServerError, "internal")
	enable("")
	if got := e.order(e.do("GET", "/orders/"+o.ID, ""), http.StatusOK); got.Status != ordersapi.StatusCreated || len(e.events(o.ID)) != 1 {
		t.Fatalf("after a rolled-back cancel: %+v, %d events", got, len(e.events(o.ID)))
	}
	e.order(e.do("POST", "/orders/"+o.ID+"/cancel", ""), http.StatusOK)
	if evs := e.events(o.ID); len(evs) != 2 || evs[1].Sequence != 2 {
		t.Fatalf("events %+v", evs)
	}
	if s := e.svc.Stats(); s.RolledBack != 2 || s.Created != 1 || s.Cancelled != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for range 2 {
		if err := e.svc.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.table("products")).Scan(&n); err != nil || n != 8 {
		t.Fatalf("%d products (%v)", n, err)
	}
}
