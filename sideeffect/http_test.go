package sideeffect

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
)

func TestHTTPOutcome(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.URL.Query().Get("status"))
		if code == 0 {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close() // the response is lost
			return
		}
		w.WriteHeader(code)
		w.Write([]byte(`{"status":` + strconv.Itoa(code) + `}`)) //nolint:errcheck
	}))
	defer srv.Close()
	get := func(url string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		return srv.Client().Do(req)
	}
	// A port nobody listens on: the connection is refused.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()

	for _, c := range []struct {
		url      string
		want     kind
		ok, body bool
	}{
		{srv.URL + "?status=200", kindAmbiguous, true, true},
		{srv.URL + "?status=201", kindAmbiguous, true, true},
		{srv.URL + "?status=402", kindRejected, false, true},
		{srv.URL + "?status=422", kindRejected, false, true},
		{srv.URL + "?status=429", kindNotSent, false, false},
		{srv.URL + "?status=408", kindAmbiguous, false, false},
		{srv.URL + "?status=409", kindAmbiguous, false, false},
		{srv.URL + "?status=500", kindAmbiguous, false, false},
		{srv.URL + "?status=503", kindAmbiguous, false, false},
		{srv.URL + "?status=0", kindAmbiguous, false, false},
		{closed, kindNotSent, false, false},
	} {
		body, err := HTTPOutcome(get(c.url))
		if c.ok != (err == nil) || (err != nil && classify(err) != c.want) || c.body != (len(body) > 0) {
			t.Errorf("%s: body %q, err %v (kind %v); want ok %v, kind %v, body %v", c.url, body, err, classify(err), c.ok, c.want, c.body)
		}
	}
}
