package ordersapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/pgoutbox/outbox/examples/orders/ordersapi"
)

// serve runs one request through the API's handler directly, not through a
// server: a real net/http server refuses some hostile bytes itself (a NUL in
// a header value, for one), and the handler must stand on its own. path is
// the escaped path ("/orders/%00"); a key of nil sends no Idempotency-Key.
func (e *env) serve(method, path, body string, key *string) response {
	e.t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != nil {
		req.Header[ordersapi.HeaderIdempotencyKey] = []string{*key} // raw: no validation on the way in
	}
	rec := httptest.NewRecorder()
	e.svc.Handler().ServeHTTP(rec, req)
	return response{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
}

// rows is the total number of rows the API and the outbox hold.
func (e *env) rows() int {
	e.t.Helper()
	o, i, ev, k, a := e.written()
	return o + i + ev + k + a
}

// orders is the number of orders.
func (e *env) orders() int {
	e.t.Helper()
	o, _, _, _, _ := e.written()
	return o
}

func ptr(s string) *string { return &s }

// body is a create request with the given customer id and first SKU, both as
// they appear between the quotes of the JSON text (so escapes stay escapes
// and raw bytes stay raw).
func body(customer, sku string) string {
	return `{"customer_id": "` + customer + `", "items": [{"sku": "` + sku + `", "quantity": 1}, {"sku": "SKU-1002", "quantity": 2}]}`
}

// TestHostileInput: text PostgreSQL cannot store (invalid UTF-8, NUL), text
// encoding/json silently replaced (lone surrogates, raw invalid bytes, both
// decoded as U+FFFD) and absurd lengths, in every string the API takes: the
// body's fields, the Idempotency-Key header and the order id in the path.
// Each is refused with a problem naming the field, before anything is
// written. On the code before checkText, most were a 500 from PostgreSQL
// ("invalid byte sequence for encoding UTF8", "unsupported Unicode escape
// sequence") and the U+FFFD cases created an order with another customer id
// or were answered as an unknown SKU.
func TestHostileInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// An order exists, so that a hostile id cannot pass for "nothing to find".
	existing := e.order(e.do("POST", "/orders", validBody, "Idempotency-Key: k-existing"), http.StatusCreated)

	cases := []struct {
		name         string
		method, path string
		body         string
		key          *string
		status       int
		typ          string
		names        string // the detail must contain this: the field, or what is wrong
	}{
		// The Idempotency-Key header.
		{"key invalid UTF-8", "POST", "/orders", validBody, ptr("k-\xff\xfe"), 400, "malformed-request", "Idempotency-Key"},
		{"key truncated UTF-8", "POST", "/orders", validBody, ptr("k-\xc3"), 400, "malformed-request", "Idempotency-Key"},
		{"key NUL", "POST", "/orders", validBody, ptr("k-\x00-1"), 400, "malformed-request", "Idempotency-Key"},
		{"key U+FFFD", "POST", "/orders", validBody, ptr("k-\uFFFD"), 400, "malformed-request", "Idempotency-Key"},
		{"key encoded surrogate", "POST", "/orders", validBody, ptr("k-\xed\xa0\x80"), 400, "malformed-request", "Idempotency-Key"},
		{"key too long and invalid", "POST", "/orders", validBody, ptr(strings.Repeat("\xff", 1000)), 400, "malformed-request", "Idempotency-Key"},
		// A key that is merely too long is well-formed text breaking a rule:
		// 422, as documented and tested before (TestBadRequests).
		{"key absurd length", "POST", "/orders", validBody, ptr(strings.Repeat("k", 64<<10)), 422, "validation-failed", "Idempotency-Key"},

		// customer_id.
		{"customer NUL escape", "POST", "/orders", body(`c-\u0000`, "SKU-1001"), nil, 400, "malformed-request", "customer_id"},
		{"customer only NUL", "POST", "/orders", body(`\u0000`, "SKU-1001"), nil, 400, "malformed-request", "customer_id"},
		{"customer lone high surrogate", "POST", "/orders", body(`c-\ud800`, "SKU-1001"), nil, 400, "malformed-request", "customer_id"},
		{"customer lone low surrogate", "POST", "/orders", body(`\udfff`, "SKU-1001"), nil, 400, "malformed-request", "customer_id"},
		{"customer reversed surrogates", "POST", "/orders", body(`c-\udc00\ud800`, "SKU-1001"), nil, 400, "malformed-request", "customer_id"},
		{"customer raw invalid UTF-8", "POST", "/orders", body("c-\xff", "SKU-1001"), nil, 400, "malformed-request", "customer_id"},
		{"customer raw overlong NUL", "POST", "/orders", body("c-\xc0\x80", "SKU-1001"), nil, 400, "malformed-request", "customer_id"},
		{"customer absurd length", "POST", "/orders", body(strings.Repeat("c", 100<<10), "SKU-1001"), nil, 422, "validation-failed", "customer_id"},
		// A raw NUL (or any control byte) inside a JSON string is a syntax
		// error: the detail points at the byte, as for any invalid JSON.
		{"customer raw NUL", "POST", "/orders", body("c-\x00", "SKU-1001"), nil, 400, "malformed-request", "not valid JSON"},

		// The SKUs.
		{"sku NUL escape", "POST", "/orders", body("c-1", `SKU-1001\u0000`), nil, 400, "malformed-request", "items[0].sku"},
		{"sku lone surrogate", "POST", "/orders", body("c-1", `SKU-\udbff`), nil, 400, "malformed-request", "items[0].sku"},
		{"sku raw invalid UTF-8", "POST", "/orders", body("c-1", "SKU-\x80"), nil, 400, "malformed-request", "items[0].sku"},
		{"second sku NUL", "POST", "/orders", `{"customer_id": "c-1", "items": [{"sku": "SKU-1001", "quantity": 1}, {"sku": "\u0000", "quantity": 1}]}`,
			nil, 400, "malformed-request", "items[1].sku"},
		// A malformed field among broken rules: still a 400, and the detail
		// names the malformed field first.
		{"malformed and invalid", "POST", "/orders", `{"customer_id": "", "items": [{"sku": "S\u0000", "quantity": 0}]}`,
			nil, 400, "malformed-request", "items[0].sku"},

		// The order id in the path.
		{"get id NUL", "GET", "/orders/%00", "", nil, 400, "malformed-request", "{id}"},
		{"get id invalid UTF-8", "GET", "/orders/%ff", "", nil, 400, "malformed-request", "{id}"},
		{"get id truncated UTF-8", "GET", "/orders/%c3%28", "", nil, 400, "malformed-request", "{id}"},
		{"get id encoded surrogate", "GET", "/orders/%ed%a0%80", "", nil, 400, "malformed-request", "{id}"},
		{"get id U+FFFD", "GET", "/orders/%ef%bf%bd", "", nil, 400, "malformed-request", "{id}"},
		{"get existing id with NUL", "GET", "/orders/" + existing.ID + "%00", "", nil, 400, "malformed-request", "{id}"},
		{"cancel id NUL", "POST", "/orders/%00/cancel", "", nil, 400, "malformed-request", "{id}"},
		{"cancel id invalid UTF-8", "POST", "/orders/%fe%ff/cancel", "", nil, 400, "malformed-request", "{id}"},
		{"cancel existing id with NUL", "POST", "/orders/" + existing.ID + "%00/cancel", "", nil, 400, "malformed-request", "{id}"},
		{"cancel existing id invalid UTF-8", "POST", "/orders/" + existing.ID + "%ff/cancel", "", nil, 400, "malformed-request", "{id}"},
		// A well-formed id that names no order stays a 404, as documented:
		// not a UUID, an absurd length, a UUID in another spelling.
		{"get id not a UUID", "GET", "/orders/no-such-order", "", nil, 404, "order-not-found", "does not exist"},
		{"get id absurd length", "GET", "/orders/" + strings.Repeat("x", 64<<10), "", nil, 404, "order-not-found", "does not exist"},
		{"get id upper case", "GET", "/orders/" + strings.ToUpper(existing.ID), "", nil, 404, "order-not-found", "does not exist"},
		{"cancel id braces", "POST", "/orders/%7B" + existing.ID + "%7D/cancel", "", nil, 404, "order-not-found", "does not exist"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.t = t
			before, stats := e.rows(), e.svc.Stats()
			p := e.problem(e.serve(c.method, c.path, c.body, c.key), c.status, c.typ)
			if !strings.Contains(p.Detail, c.names) {
				t.Errorf("detail %q does not name %q", p.Detail, c.names)
			}
			if after := e.rows(); after != before {
				t.Errorf("%d rows before, %d after: the refused request wrote", before, after)
			}
			if s := e.svc.Stats(); s.Created != stats.Created || s.Cancelled != stats.Cancelled || s.RolledBack != stats.RolledBack {
				t.Errorf("stats %+v before, %+v after", stats, s)
			}
		})
	}
	e.t = t
	// The existing order is untouched and still readable.
	if got := e.order(e.do("GET", "/orders/"+existing.ID, ""), http.StatusOK); got.Status != ordersapi.StatusCreated {
		t.Fatalf("the existing order is now %+v", got)
	}
	if evs := e.events(existing.ID); len(evs) != 1 {
		t.Fatalf("events of the existing order %+v", evs)
	}
}

// TestHostileLoad runs valid and hostile requests concurrently through a real
// server and client, as a hostile client under load would, and asserts that
// none is answered 5xx, that every refusal is a problem, and that exactly the
// accepted commands wrote rows. (Before checkText, about a third of these
// requests were 500s.)
func TestHostileLoad(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const workers, perWorker = 6, 42 // a third of each worker's requests are valid
	// Requests a net/http client can send (it refuses a NUL in a header
	// value itself; TestHostileInput covers that one).
	hostile := []struct {
		method, path, body, key string
	}{
		{"POST", "/orders", validBody, "k-\xff"},
		{"POST", "/orders", validBody, "k-\xed\xa0\x80"},
		{"POST", "/orders", body(`c-\u0000`, "SKU-1001"), ""},
		{"POST", "/orders", body(`c-\ud800`, "SKU-1001"), ""},
		{"POST", "/orders", body("c-\xff", "SKU-1001"), ""},
		{"POST", "/orders", body("c-1", `SKU-1001\u0000`), ""},
		{"GET", "/orders/%00", "", ""},
		{"GET", "/orders/%ff", "", ""},
		{"POST", "/orders/%00/cancel", "", ""},
		{"POST", "/orders/%c3/cancel", "", ""},
	}
	type result struct {
		status int
		what   string
		body   []byte
	}
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
	)
	send := func(method, path, body, key string) (int, []byte, http.Header) {
		req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return 0, nil, nil
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if key != "" {
			req.Header[ordersapi.HeaderIdempotencyKey] = []string{key}
		}
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Error(err)
			return 0, nil, nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b, resp.Header
	}
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				var (
					what   string
					status int
					b      []byte
					h      http.Header
				)
				if i%3 == 0 { // a valid order, read and cancelled
					what = "create"
					status, b, h = send("POST", "/orders", validBody, fmt.Sprintf("k-%d-%d", w, i))
					var o ordersapi.Order
					if status == http.StatusCreated && json.Unmarshal(b, &o) == nil {
						mu.Lock()
						results = append(results, result{status, what, b})
						mu.Unlock()
						what = "cancel"
						status, b, h = send("POST", "/orders/"+o.ID+"/cancel", "", "")
					}
				} else {
					r := hostile[(w*perWorker+i)%len(hostile)]
					what = fmt.Sprintf("%s %s %q key %q", r.method, r.path, r.body, r.key)
					status, b, h = send(r.method, r.path, r.body, r.key)
					if status >= 400 && h.Get("Content-Type") != "application/problem+json" {
						t.Errorf("%s: %d with Content-Type %q", what, status, h.Get("Content-Type"))
					}
				}
				mu.Lock()
				results = append(results, result{status, what, b})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	created, cancelled, refused := 0, 0, 0
	for _, r := range results {
		switch {
		case r.status >= 500 || r.status == 0:
			t.Errorf("%s: %d %s", r.what, r.status, r.body)
		case r.what == "create" && r.status == http.StatusCreated:
			created++
		case r.what == "cancel" && r.status == http.StatusOK:
			cancelled++
		case r.status == http.StatusBadRequest:
			refused++
		default:
			t.Errorf("%s: unexpected %d %s", r.what, r.status, r.body)
		}
	}
	if want := workers * perWorker / 3; created != want || cancelled != want || refused != workers*perWorker-want {
		t.Errorf("%d created, %d cancelled, %d refused with 400; want %d, %d, %d", created, cancelled, refused, want, want, workers*perWorker-want)
	}
	o, i, ev, k, _ := e.written()
	if o != created || i != 2*created || ev != created+cancelled || k != created {
		t.Errorf("%d orders, %d items, %d events, %d keys for %d orders created and %d cancelled", o, i, ev, k, created, cancelled)
	}
}
