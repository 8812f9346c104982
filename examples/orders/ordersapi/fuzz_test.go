package ordersapi_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"testing"

	"github.com/pgoutbox/outbox/examples/orders/ordersapi"
)

// FuzzDecodeRequest drives the API's request decoding end to end: a create
// with the fuzzed body and Idempotency-Key (an empty key sends no header),
// then a read and a cancel of the fuzzed order id, all through the real
// handler on a real schema. The property is that the API never answers 5xx
// to anything a client sends, and that it keeps its contract:
//
//   - every refusal of POST /orders is a problem (the route always matches),
//     and a refused create writes nothing;
//   - an accepted create wrote one order, and reading it back returns what
//     the create answered;
//   - every answer of the API's own handlers is JSON or a problem whose
//     status matches (paths the router itself refuses, such as an empty id,
//     are plain text and only have to stay under 500).
//
// The seed corpus in testdata/fuzz/FuzzDecodeRequest holds the hostile
// inputs of issue 8: invalid UTF-8 and NUL in the key, \u0000 and lone
// surrogates in customer_id and the SKUs, NUL and invalid UTF-8 in the id.
// Run it with
//
//	go test -run='^$' -fuzz='^FuzzDecodeRequest$' -fuzztime=10s ./examples/orders/ordersapi
func FuzzDecodeRequest(f *testing.F) {
	f.Add(validBody, "", "")
	f.Add(validBody, "k-1", "01a23158-1edc-7df8-9bf7-ab87a7f0f729")
	e := newEnv(f)
	f.Fuzz(func(t *testing.T, body, key, id string) {
		e.t = t
		var k *string
		if key != "" {
			k = &key
		}
		ordersBefore, rowsBefore := e.orders(), e.rows()
		r := e.serve("POST", "/orders", body, k)
		check(t, "POST /orders", r, true)
		switch ordersAfter, rowsAfter := e.orders(), e.rows(); r.status {
		case http.StatusCreated:
			if ordersAfter != ordersBefore+1 {
				t.Fatalf("201 but %d orders before, %d after", ordersBefore, ordersAfter)
			}
			var created ordersapi.Order
			if err := json.Unmarshal(r.body, &created); err != nil {
				t.Fatalf("201 with %s: %v", r.body, err)
			}
			got := e.serve("GET", "/orders/"+created.ID, "", nil)
			var read ordersapi.Order
			if got.status != http.StatusOK || json.Unmarshal(got.body, &read) != nil ||
				read.CustomerID != created.CustomerID || !slices.Equal(read.Items, created.Items) {
				t.Fatalf("created %s, read back %d %s", r.body, got.status, got.body)
			}
		default: // refused, or an idempotent replay: nothing written
			if rowsAfter != rowsBefore {
				t.Fatalf("answered %d but wrote: %d rows before, %d after (%s)", r.status, rowsBefore, rowsAfter, r.body)
			}
		}

		path := "/orders/" + url.PathEscape(id)
		check(t, "GET "+path, e.serve("GET", path, "", nil), false)
		check(t, "POST "+path+"/cancel", e.serve("POST", path+"/cancel", "", nil), false)
	})
}

// check asserts the answer is not a 5xx and is well-formed: JSON or a
// problem of the same status. routed says the request always reaches the
// API's handlers, so any refusal must be a problem.
func check(t *testing.T, what string, r response, routed bool) {
	t.Helper()
	if r.status >= 500 {
		t.Fatalf("%s: %d %s", what, r.status, r.body)
	}
	switch ct := r.header.Get("Content-Type"); {
	case ct == "application/problem+json":
		var p ordersapi.Problem
		if err := json.Unmarshal(r.body, &p); err != nil || p.Status != r.status || p.Type == "" || p.Detail == "" {
			t.Fatalf("%s: %d with problem %s (%v)", what, r.status, r.body, err)
		}
	case ct == "application/json":
		if r.status >= 300 || !json.Valid(r.body) {
			t.Fatalf("%s: %d with JSON %s", what, r.status, r.body)
		}
	case routed:
		t.Fatalf("%s: %d with Content-Type %q: %s", what, r.status, ct, r.body)
	}
}
