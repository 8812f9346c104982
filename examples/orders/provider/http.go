package provider

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"
)

// MaxBodyBytes bounds a request body.
const MaxBodyBytes = 64 << 10

// ProblemTypeBase prefixes the "type" URI of every problem the provider
// returns.
const ProblemTypeBase = "https://github.com/pgoutbox/outbox/tree/main/examples/orders#provider-problem-"

// Header names.
const (
	// HeaderIdempotencyKey makes POST /charges and POST /refunds safe to
	// retry in idempotent mode.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderIdempotentReplayed is "true" on a response replayed from an
	// earlier request with the same Idempotency-Key.
	HeaderIdempotentReplayed = "Idempotent-Replayed"
)

// Problem is an RFC 9457 problem details object, the body of every error
// response. A declined charge (402) carries the charge, a failed refund
// (402) the refund.
type Problem struct {
	Type     string  `json:"type"`
	Title    string  `json:"title"`
	Status   int     `json:"status"`
	Detail   string  `json:"detail,omitempty"`
	Instance string  `json:"instance,omitempty"`
	Charge   *Charge `json:"charge,omitempty"`
	Refund   *Refund `json:"refund,omitempty"`
}

func declined(c Charge) Problem {
	return Problem{Type: ProblemTypeBase + "card-declined", Title: "Charge declined", Status: http.StatusPaymentRequired,
		Detail: "the charge was declined: " + c.FailureCode, Instance: "/charges/" + c.ID, Charge: &c}
}

func failedRefund(r Refund) Problem {
	return Problem{Type: ProblemTypeBase + "refund-failed", Title: "Refund failed", Status: http.StatusPaymentRequired,
		Detail: "the refund failed: " + r.FailureCode, Instance: "/refunds/" + r.ID, Refund: &r}
}

// Handler serves the provider's API (see the package documentation).
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", s.handleCharge)
	mux.HandleFunc("POST /refunds", s.handleRefund)
	mux.HandleFunc("GET /charges/{id}", func(w http.ResponseWriter, r *http.Request) {
		c, err := s.GetCharge(r.Context(), r.PathValue("id"))
		s.answer(w, r, c, err)
	})
	mux.HandleFunc("GET /refunds/{id}", func(w http.ResponseWriter, r *http.Request) {
		re, err := s.GetRefund(r.Context(), r.PathValue("id"))
		s.answer(w, r, re, err)
	})
	mux.HandleFunc("GET /charges", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case q.Has("key"):
			c, err := s.ChargeByKey(r.Context(), q.Get("key"))
			s.answer(w, r, c, err)
		case q.Has("reference"):
			cs, err := s.ChargesOfReference(r.Context(), q.Get("reference"))
			s.answer(w, r, List[Charge]{Data: nonNil(cs)}, err)
		default:
			s.answer(w, r, nil, refuse(Invalid, "ask for ?key=K or ?reference=R"))
		}
	})
	mux.HandleFunc("GET /refunds", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case q.Has("key"):
			re, err := s.RefundByKey(r.Context(), q.Get("key"))
			s.answer(w, r, re, err)
		case q.Has("reference"):
			rs, err := s.RefundsOfReference(r.Context(), q.Get("reference"))
			s.answer(w, r, List[Refund]{Data: nonNil(rs)}, err)
		default:
			s.answer(w, r, nil, refuse(Invalid, "ask for ?key=K or ?reference=R"))
		}
	})
	mux.HandleFunc("GET /ledger", func(w http.ResponseWriter, r *http.Request) {
		l, err := s.Ledger(r.Context(), r.URL.Query().Get("reference"))
		s.answer(w, r, l, err)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.pool.Ping(r.Context()); err != nil {
			s.writeProblem(w, r, Problem{Type: ProblemTypeBase + "unavailable", Title: "Database unavailable",
				Status: http.StatusServiceUnavailable, Detail: "the provider's database does not answer"})
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok "+string(s.cfg.Mode)+"\n")
	})
	return mux
}

// List is the body of a lookup by reference.
type List[T any] struct {
	Data []T `json:"data"`
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// ControlHandler serves the fault control API, for a listener of its own:
//
//	GET  /control/faults   the rules in force, their counters and the seed
//	POST /control/faults   replace the rules (a Faults object); counters restart
func (s *Service) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /control/faults", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.FaultStatus())
	})
	mux.HandleFunc("POST /control/faults", func(w http.ResponseWriter, r *http.Request) {
		var f Faults
		if err := decodeJSON(w, r, &f); err != nil {
			s.answer(w, r, nil, err)
			return
		}
		if err := s.SetFaults(f); err != nil {
			s.answer(w, r, nil, refuse(Invalid, "%v", err))
			return
		}
		writeJSON(w, http.StatusOK, s.FaultStatus())
	})
	return mux
}

// SetFaults replaces the faults in force and restarts their counters.
func (s *Service) SetFaults(f Faults) error {
	if err := s.faults.set(f); err != nil {
		return err
	}
	st := s.faults.status()
	rules := make([]string, len(f.Rules))
	for i, r := range f.Rules {
		rules[i] = r.String()
	}
	s.log.Info("provider faults set", slog.Uint64("seed", st.Seed), slog.String("rules", strings.Join(rules, " ")))
	return nil
}

// FaultStatus returns the faults in force and their counters.
func (s *Service) FaultStatus() FaultStatus {
	st := s.faults.status()
	st.InFlight = s.InFlight()
	return st
}

var errInjected = &Error{Kind: Injected, Detail: "injected failure before commit; nothing was written"}

func (s *Service) handleCharge(w http.ResponseWriter, r *http.Request) {
	var req ChargeRequest
	s.handleWrite(w, r, "charges", &req, func() error { return req.Validate() },
		func(ctx context.Context, key string, h hooks) (outcome, error) { return s.charge(ctx, key, req, h) })
}

func (s *Service) handleRefund(w http.ResponseWriter, r *http.Request) {
	var req RefundRequest
	s.handleWrite(w, r, "refunds", &req, func() error { return req.Validate() },
		func(ctx context.Context, key string, h hooks) (outcome, error) { return s.refund(ctx, key, req, h) })
}

// handleWrite decodes and validates a write request, draws its faults and
// executes it, injecting the faults around the commit.
func (s *Service) handleWrite(w http.ResponseWriter, r *http.Request, endpoint string, req any, validate func() error,
	run func(ctx context.Context, key string, h hooks) (outcome, error)) {
	key := ""
	if vals, ok := r.Header[HeaderIdempotencyKey]; ok {
		key = strings.TrimSpace(vals[0])
		if err := checkText(HeaderIdempotencyKey, key, true); err != nil {
			s.answer(w, r, nil, err)
			return
		}
	}
	if err := decodeJSON(w, r, req); err != nil {
		s.answer(w, r, nil, err)
		return
	}
	if err := validate(); err != nil {
		s.answer(w, r, nil, err)
		return
	}
	d := s.faults.decide(endpoint)
	if d.fault != "" && s.cfg.OnFault != nil {
		s.cfg.OnFault(r, d.fault)
	}
	h := hooks{}
	if d.latency > 0 {
		h.beforeWork = func(ctx context.Context) error {
			t := time.NewTimer(d.latency)
			defer t.Stop()
			select {
			case <-t.C:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	if d.fault == FaultErrorBeforeCommit {
		h.beforeCommit = func() error { return errInjected }
	}
	out, err := run(r.Context(), key, h)
	// A fault drawn for the request applies whatever the request's own
	// outcome (a refusal's answer can be lost too), so its counters say
	// what callers saw.
	switch d.fault {
	case "":
		if err != nil {
			s.answer(w, r, nil, err)
			return
		}
	case FaultErrorBeforeCommit, FaultErrorAfterCommit:
		s.writeProblem(w, r, Problem{Type: ProblemTypeBase + "internal", Title: "Internal error", Status: http.StatusInternalServerError,
			Detail: "injected fault (" + string(d.fault) + "): the request failed; it may or may not have been executed"})
		return
	case FaultTimeoutAfterCommit:
		t := time.NewTimer(d.hang)
		select {
		case <-r.Context().Done():
		case <-t.C:
		case <-s.stopHanging:
		}
		t.Stop()
		drop(w)
		return
	case FaultDropResponse:
		drop(w)
		return
	case FaultCrash:
		s.log.Warn("provider crashing (injected fault)", slog.String("endpoint", endpoint), slog.Bool("injected", true))
		s.cfg.Crash()
		drop(w)
		return
	}
	if out.replayed {
		w.Header().Set(HeaderIdempotentReplayed, "true")
	}
	w.Header().Set("Content-Type", "application/json")
	if out.status >= 400 {
		w.Header().Set("Content-Type", "application/problem+json")
	}
	w.WriteHeader(out.status)
	_, _ = w.Write(out.body)
}

// drop closes the connection without a response, with a reset (linger 0)
// where it can.
func drop(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// decodeJSON strictly decodes one JSON object from the body (and checks the
// content type).
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return refuse(Invalid, "send application/json, not %q", ct)
		}
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return refuse(Invalid, "the request body is empty; send a JSON object")
		}
		return refuse(Invalid, "the body is not a valid request: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if err := dec.Decode(&struct{}{}); !errors.Is(err, io.EOF) {
		return refuse(Invalid, "the body holds more than one JSON value")
	}
	return nil
}

// answer writes v as JSON, or the problem for err.
func (s *Service) answer(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err == nil {
		writeJSON(w, http.StatusOK, v)
		return
	}
	var e *Error
	if !errors.As(err, &e) {
		if r.Context().Err() == nil {
			s.log.Error("request failed", slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
		}
		s.writeProblem(w, r, Problem{Type: ProblemTypeBase + "internal", Title: "Internal error", Status: http.StatusInternalServerError,
			Detail: "the request failed; nothing was committed"})
		return
	}
	p := Problem{Detail: e.Detail}
	switch e.Kind {
	case Invalid:
		p.Type, p.Title, p.Status = "invalid-request", "Invalid request", http.StatusBadRequest
	case NotFound:
		p.Type, p.Title, p.Status = "not-found", "Not found", http.StatusNotFound
	case LookupUnsupported:
		p.Type, p.Title, p.Status = "lookup-unsupported", "Lookup not offered", http.StatusNotFound
	case InProgress:
		p.Type, p.Title, p.Status = "request-in-progress", "Request in progress", http.StatusConflict
	case KeyReused:
		p.Type, p.Title, p.Status = "idempotency-key-reused", "Idempotency-Key reused", http.StatusUnprocessableEntity
	case AmbiguousReference:
		p.Type, p.Title, p.Status = "reference-ambiguous", "Reference has several charges", http.StatusConflict
	case Injected:
		// Worded like the after-commit failure: the caller cannot tell.
		p.Type, p.Title, p.Status = "internal", "Internal error", http.StatusInternalServerError
		p.Detail = "the request failed; it may or may not have been executed"
	default:
		p.Type, p.Title, p.Status = "bad-request", "Bad request", http.StatusBadRequest
	}
	p.Type = ProblemTypeBase + p.Type
	s.writeProblem(w, r, p)
}

func (s *Service) writeProblem(w http.ResponseWriter, r *http.Request, p Problem) {
	if p.Instance == "" {
		p.Instance = r.URL.Path
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
