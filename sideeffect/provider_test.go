package sideeffect_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/pgoutbox/outbox/sideeffect"
)

// fakeProvider is a payment provider for the tests: POST /charges charges
// (the ledger is the witness of what happened), GET /charges/{key} looks a
// charge up. In mode idempotent it honours Idempotency-Key like the big
// payment APIs (same key and body: the stored response; same key, other
// body: 422); in the other modes every POST charges. Faults are queued and
// taken one per POST.
type fakeProvider struct {
	mode   sideeffect.Mode
	srv    *httptest.Server
	url    string       // the server's, as clients reach it
	client *http.Client // the clients'

	mu       sync.Mutex
	ledger   []charge          // every charge made, duplicates included
	byKey    map[string]stored // idempotent: the first response per key
	posts    int               // POST requests received
	lookups  int               // GET requests received
	faults   []fault
	declined map[string]bool // keys to decline (402)
	// hung is signalled when a request hangs after commit: the test's
	// client then gives up, as its timeout would (no clock involved).
	hung chan struct{}
}

type charge struct {
	Key    string `json:"key"`
	Amount int    `json:"amount"`
	ID     int    `json:"id"`
}

type stored struct {
	body   []byte
	status int
	resp   []byte
}

type fault int

const (
	faultNone fault = iota
	// faultHangAfterCommit: charge, then hold the response until the
	// client gives up (a timeout after the provider committed).
	faultHangAfterCommit
	// faultDropAfterCommit: charge, then close the connection without a
	// response (a lost response).
	faultDropAfterCommit
	// faultDropBeforeCommit: close the connection without charging (the
	// request was lost on its way).
	faultDropBeforeCommit
	// fault503AfterCommit: charge, then answer 503.
	fault503AfterCommit
)

func newFakeProvider(t *testing.T, mode sideeffect.Mode) *fakeProvider {
	p := &fakeProvider{mode: mode, byKey: map[string]stored{}, declined: map[string]bool{}, hung: make(chan struct{}, 16)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", p.charge)
	mux.HandleFunc("GET /charges/{key}", p.lookup)
	p.srv = httptest.NewServer(mux)
	p.url, p.client = p.srv.URL, p.srv.Client()
	t.Cleanup(p.srv.Close)
	return p
}

func (p *fakeProvider) inject(f ...fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = append(p.faults, f...)
}

func (p *fakeProvider) charges(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.ledger {
		if c.Key == key {
			n++
		}
	}
	return n
}

func (p *fakeProvider) counts() (posts, lookups int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.posts, p.lookups
}

func (p *fakeProvider) charge(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	p.posts++
	f := faultNone
	if len(p.faults) > 0 {
		f, p.faults = p.faults[0], p.faults[1:]
	}
	if f == faultDropBeforeCommit {
		p.mu.Unlock()
		drop(w)
		return
	}
	if p.mode == sideeffect.Idempotent {
		if s, ok := p.byKey[key]; ok {
			p.mu.Unlock()
			if !bytes.Equal(s.body, body) {
				http.Error(w, "idempotency key reused with a different request", http.StatusUnprocessableEntity)
				return
			}
			w.WriteHeader(s.status)
			w.Write(s.resp) //nolint:errcheck
			return
		}
	}
	var req struct {
		Amount int `json:"amount"`
	}
	_ = json.Unmarshal(body, &req)
	st := stored{body: body, status: http.StatusOK}
	if p.declined[key] {
		st.status, st.resp = http.StatusPaymentRequired, []byte(`{"error":"card_declined"}`)
	} else {
		c := charge{Key: key, Amount: req.Amount, ID: len(p.ledger) + 1}
		p.ledger = append(p.ledger, c)
		st.resp, _ = json.Marshal(c)
	}
	p.byKey[key] = st
	p.mu.Unlock()
	switch f {
	case faultHangAfterCommit:
		p.hung <- struct{}{}
		<-r.Context().Done()
		return
	case faultDropAfterCommit:
		drop(w)
		return
	case fault503AfterCommit:
		http.Error(w, "upstream failure", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(st.status)
	w.Write(st.resp) //nolint:errcheck
}

// lookup answers what happened to a key (modes idempotent and queryable).
func (p *fakeProvider) lookup(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	p.mu.Lock()
	p.lookups++
	s, ok := p.byKey[key]
	p.mu.Unlock()
	if p.mode == sideeffect.Neither {
		http.Error(w, "no lookup", http.StatusNotImplemented)
		return
	}
	if !ok {
		http.Error(w, "no such charge", http.StatusNotFound)
		return
	}
	w.WriteHeader(s.status)
	w.Write(s.resp) //nolint:errcheck
}

func drop(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		conn.Close()
	}
}

// call returns the sideeffect.Call that charges amount, classifying the
// outcome as a real client would.
func (p *fakeProvider) call(amount int) (sideeffect.Call, []byte) {
	body, _ := json.Marshal(map[string]int{"amount": amount})
	return func(ctx context.Context, key string) ([]byte, error) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-p.hung: // the provider hangs: time out now
				cancel()
			case <-ctx.Done():
			}
		}()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"/charges", bytes.NewReader(body))
		if err != nil {
			return nil, sideeffect.NotSent(err)
		}
		req.Header.Set("Idempotency-Key", key)
		// net/http replays a request carrying an Idempotency-Key header
		// when a reused connection closes before the response: a second
		// charge at a provider that ignores the key. Without GetBody the
		// request is not replayable (the property test found this).
		req.GetBody = nil
		return sideeffect.HTTPOutcome(p.client.Do(req))
	}, body
}

// lookupFn is the provider's lookup as a sideeffect.Lookup.
func (p *fakeProvider) lookupFn() sideeffect.Lookup {
	return sideeffect.LookupFunc(func(ctx context.Context, key string) (sideeffect.LookupResult, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"/charges/"+key, nil)
		if err != nil {
			return sideeffect.LookupResult{}, err
		}
		resp, err := p.client.Do(req)
		if err != nil {
			return sideeffect.LookupResult{}, err
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		if err != nil {
			return sideeffect.LookupResult{}, err
		}
		switch {
		case resp.StatusCode == http.StatusOK:
			return sideeffect.LookupResult{Found: true, Response: out}, nil
		case resp.StatusCode == http.StatusNotFound:
			return sideeffect.LookupResult{}, nil
		case resp.StatusCode == http.StatusPaymentRequired:
			return sideeffect.LookupResult{Found: true, Failed: true, Response: out}, nil
		}
		return sideeffect.LookupResult{}, errors.New("lookup: " + resp.Status)
	})
}
