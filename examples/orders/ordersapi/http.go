package ordersapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
)

// MaxBodyBytes bounds a request body.
const MaxBodyBytes = 1 << 20

// ProblemTypeBase prefixes the "type" URI of every problem the API returns.
const ProblemTypeBase = "https://github.com/pgoutbox/outbox/tree/main/examples/orders#problem-"

// Problem is an RFC 9457 problem details object, sent as
// application/problem+json for every refused request.
type Problem struct {
	Type     string   `json:"type"`
	Title    string   `json:"title"`
	Status   int      `json:"status"`
	Detail   string   `json:"detail,omitempty"`
	Instance string   `json:"instance,omitempty"`
	Errors   []string `json:"errors,omitempty"`
}

// Header names.
const (
	// HeaderIdempotencyKey makes POST /orders safe to retry.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderIdempotentReplayed is "true" on a response answered from an
	// earlier request with the same Idempotency-Key.
	HeaderIdempotentReplayed = "Idempotent-Replayed"
)

// Handler serves the order API:
//
//	POST /orders               place an order (201; 200 for an idempotent replay)
//	GET  /orders/{id}          read an order
//	POST /orders/{id}/cancel   cancel an order (200; 409 when already cancelled)
//	GET  /healthz              200 when the database answers
//
// Each request runs in an OpenTelemetry SERVER span (Config.TracerProvider)
// that continues an incoming traceparent header; the events it writes carry
// the span's trace context to the relay and the consumers.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", s.handleCreate)
	mux.HandleFunc("GET /orders/{id}", s.handleGet)
	mux.HandleFunc("POST /orders/{id}/cancel", s.handleCancel)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.pool.Ping(r.Context()); err != nil {
			s.writeProblem(w, r, Problem{Type: ProblemTypeBase + "unavailable", Title: "Database unavailable",
				Status: http.StatusServiceUnavailable, Detail: err.Error()})
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	return traced(s.cfg.TracerProvider, mux)
}

func (s *Service) handleCreate(w http.ResponseWriter, r *http.Request) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			s.refused.Add(1)
			s.writeProblem(w, r, Problem{Type: ProblemTypeBase + "unsupported-media-type", Title: "Unsupported media type",
				Status: http.StatusUnsupportedMediaType, Detail: fmt.Sprintf("send application/json, not %q", ct)})
			return
		}
	}
	key, hasKey := "", false
	if vals, ok := r.Header[HeaderIdempotencyKey]; ok {
		key, hasKey = strings.TrimSpace(vals[0]), true
	}
	if hasKey && key == "" {
		s.refused.Add(1)
		s.writeProblem(w, r, Problem{Type: ProblemTypeBase + "malformed-request", Title: "Malformed request",
			Status: http.StatusBadRequest, Detail: "the Idempotency-Key header is empty"})
		return
	}
	var req CreateRequest
	if p, ok := decodeJSON(w, r, &req); !ok {
		s.refused.Add(1)
		s.writeProblem(w, r, p)
		return
	}
	order, replayed, err := s.Create(r.Context(), key, req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/orders/"+order.ID)
	status := http.StatusCreated
	if replayed {
		w.Header().Set(HeaderIdempotentReplayed, "true")
		status = http.StatusOK
	}
	writeJSON(w, status, order)
}

func (s *Service) handleGet(w http.ResponseWriter, r *http.Request) {
	order, err := s.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, order)
}

func (s *Service) handleCancel(w http.ResponseWriter, r *http.Request) {
	order, err := s.Cancel(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, order)
}

// decodeJSON strictly decodes one JSON value from the body: unknown fields,
// trailing data and oversized bodies are refused.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) (Problem, bool) {
	body := http.MaxBytesReader(w, r.Body, MaxBodyBytes)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	bad := func(detail string) (Problem, bool) {
		return Problem{Type: ProblemTypeBase + "malformed-request", Title: "Malformed request",
			Status: http.StatusBadRequest, Detail: detail}, false
	}
	if err := dec.Decode(v); err != nil {
		var tooLarge *http.MaxBytesError
		var syntax *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &tooLarge):
			return Problem{Type: ProblemTypeBase + "too-large", Title: "Request body too large",
				Status: http.StatusRequestEntityTooLarge, Detail: fmt.Sprintf("the body is over %d bytes", MaxBodyBytes)}, false
		case errors.Is(err, io.EOF):
			return bad("the request body is empty; send a JSON object")
		case errors.As(err, &syntax):
			return bad(fmt.Sprintf("the body is not valid JSON (at byte %d): %v", syntax.Offset, err))
		case errors.As(err, &typ):
			return bad(fmt.Sprintf("field %q must be a JSON %s, not %s", typ.Field, typ.Type, typ.Value))
		default:
			return bad("the body is not a valid order request: " + strings.TrimPrefix(err.Error(), "json: "))
		}
	}
	if err := dec.Decode(&struct{}{}); !errors.Is(err, io.EOF) {
		return bad("the body holds more than one JSON value")
	}
	return Problem{}, true
}

// writeError answers with the problem for err: the service's refusals map to
// 4xx, anything else is a 500 (logged, with a generic detail).
func (s *Service) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var e *Error
	if !errors.As(err, &e) {
		s.log.Error("request failed", slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
		s.writeProblem(w, r, Problem{Type: ProblemTypeBase + "internal", Title: "Internal error",
			Status: http.StatusInternalServerError, Detail: "the request failed; if it changed anything, it was rolled back or fully committed"})
		return
	}
	p := Problem{Detail: e.Detail, Errors: e.Errors}
	switch e.Kind {
	case Invalid:
		p.Type, p.Title, p.Status = ProblemTypeBase+"validation-failed", "Invalid order", http.StatusUnprocessableEntity
	case UnknownSKU:
		p.Type, p.Title, p.Status = ProblemTypeBase+"unknown-sku", "Unknown SKU", http.StatusUnprocessableEntity
	case KeyReused:
		p.Type, p.Title, p.Status = ProblemTypeBase+"idempotency-key-reused", "Idempotency-Key reused", http.StatusUnprocessableEntity
	case NotFound:
		p.Type, p.Title, p.Status = ProblemTypeBase+"order-not-found", "Order not found", http.StatusNotFound
	case NotCancellable:
		p.Type, p.Title, p.Status = ProblemTypeBase+"order-not-cancellable", "Order cannot be cancelled", http.StatusConflict
	case Malformed:
		p.Type, p.Title, p.Status = ProblemTypeBase+"malformed-request", "Malformed request", http.StatusBadRequest
	default:
		p.Type, p.Title, p.Status = ProblemTypeBase+"bad-request", "Bad request", http.StatusBadRequest
	}
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
