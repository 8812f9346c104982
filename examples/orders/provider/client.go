package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Errors the Client returns, to be tested with errors.Is. ErrAmbiguous
// means the request may or may not have been executed: the caller must not
// assume either, and may retry only with the same Idempotency-Key (or look
// the outcome up). Every other error is definite: the request changed
// nothing, or (ErrDeclined) was executed and definitely failed.
var (
	// ErrAmbiguous: timeout, connection error, 5xx, or the key's request
	// still in progress (409).
	ErrAmbiguous = errors.New("outcome unknown")
	// ErrDeclined: a 402; the charge was declined, or the refund failed,
	// and that outcome is recorded (a retry with the same key replays it).
	ErrDeclined = errors.New("declined")
	// ErrInvalid: a 400, or another refusal (409 for a refund by a
	// reference with several captured charges); nothing was written.
	ErrInvalid = errors.New("invalid request")
	// ErrKeyReused: a 422; the Idempotency-Key was used for a different request.
	ErrKeyReused = errors.New("idempotency key reused")
	// ErrNotFound: a 404 (nothing found, or a refund of an unknown charge).
	ErrNotFound = errors.New("not found")
	// ErrLookupUnsupported: the provider's mode does not offer the lookup.
	ErrLookupUnsupported = errors.New("lookup not offered")
	// ErrInProgress: the Idempotency-Key's request is still executing (409);
	// it also matches ErrAmbiguous.
	ErrInProgress = errors.New("request in progress")
)

// APIError is an error response, or a failure to get one.
type APIError struct {
	// Op is the request ("POST /charges").
	Op string
	// Status is the HTTP status, 0 when no response came.
	Status int
	// Problem is the response's problem body, if it had one.
	Problem *Problem
	// Err is the transport error when no response came.
	Err error

	kind error
}

func (e *APIError) Error() string {
	switch {
	case e.Err != nil:
		return fmt.Sprintf("provider %s: %v (%v)", e.Op, e.kind, e.Err)
	case e.Problem != nil && e.Problem.Detail != "":
		return fmt.Sprintf("provider %s: %d %s: %s", e.Op, e.Status, e.Problem.Title, e.Problem.Detail)
	default:
		return fmt.Sprintf("provider %s: %d %s", e.Op, e.Status, http.StatusText(e.Status))
	}
}

// Is matches the error's class (ErrAmbiguous, ErrDeclined, ...).
func (e *APIError) Is(target error) bool {
	return target == e.kind || (e.kind == ErrInProgress && target == ErrAmbiguous)
}

// Unwrap returns the transport error, if any.
func (e *APIError) Unwrap() error { return e.Err }

// Client calls a provider. It is safe for concurrent use.
type Client struct {
	base, control string
	hc            *http.Client
}

// NewClient returns a client of the provider API at baseURL
// ("http://127.0.0.1:8090"); controlURL is its control listener ("" if
// SetFaults and Faults are not used). hc defaults to http.DefaultClient;
// give it a Timeout, or pass contexts with deadlines, or an injected
// timeout-after-commit hangs the call for a minute.
func NewClient(baseURL, controlURL string, hc *http.Client) *Client {
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), control: strings.TrimRight(controlURL, "/"), hc: hc}
}

// Charge posts a charge with Idempotency-Key key (none if key is empty). A
// declined charge is returned with an error matching ErrDeclined;
// Charge.Replayed tells a replayed response.
func (c *Client) Charge(ctx context.Context, key string, req ChargeRequest) (Charge, error) {
	var ch Charge
	p, replayed, err := c.do(ctx, c.base, http.MethodPost, "/charges", key, req, &ch)
	if p != nil && p.Charge != nil {
		ch = *p.Charge
	}
	ch.Replayed = replayed
	return ch, err
}

// Refund posts a refund with Idempotency-Key key (none if key is empty). A
// failed refund is returned with an error matching ErrDeclined.
func (c *Client) Refund(ctx context.Context, key string, req RefundRequest) (Refund, error) {
	var r Refund
	p, replayed, err := c.do(ctx, c.base, http.MethodPost, "/refunds", key, req, &r)
	if p != nil && p.Refund != nil {
		r = *p.Refund
	}
	r.Replayed = replayed
	return r, err
}

// GetCharge reads a charge by id.
func (c *Client) GetCharge(ctx context.Context, id string) (Charge, error) {
	var ch Charge
	_, _, err := c.do(ctx, c.base, http.MethodGet, "/charges/"+url.PathEscape(id), "", nil, &ch)
	return ch, err
}

// LookupByKey returns the charge made with Idempotency-Key key (idempotent
// mode). ErrNotFound means no charge was committed with that key, provided
// no request with it is still on its way; ErrInProgress that one is
// executing now.
func (c *Client) LookupByKey(ctx context.Context, key string) (Charge, error) {
	var ch Charge
	_, _, err := c.do(ctx, c.base, http.MethodGet, "/charges?key="+url.QueryEscape(key), "", nil, &ch)
	return ch, err
}

// LookupByReference returns the charges of a reference, oldest first
// (queryable mode); none is an empty slice.
func (c *Client) LookupByReference(ctx context.Context, reference string) ([]Charge, error) {
	var l List[Charge]
	_, _, err := c.do(ctx, c.base, http.MethodGet, "/charges?reference="+url.QueryEscape(reference), "", nil, &l)
	return l.Data, err
}

// LookupRefundByKey returns the refund made with Idempotency-Key key
// (idempotent mode).
func (c *Client) LookupRefundByKey(ctx context.Context, key string) (Refund, error) {
	var r Refund
	_, _, err := c.do(ctx, c.base, http.MethodGet, "/refunds?key="+url.QueryEscape(key), "", nil, &r)
	return r, err
}

// LookupRefundsByReference returns the refunds of a reference's charges
// (queryable mode).
func (c *Client) LookupRefundsByReference(ctx context.Context, reference string) ([]Refund, error) {
	var l List[Refund]
	_, _, err := c.do(ctx, c.base, http.MethodGet, "/refunds?reference="+url.QueryEscape(reference), "", nil, &l)
	return l.Data, err
}

// Ledger reads the provider's ledger, of one reference if reference is not
// empty.
func (c *Client) Ledger(ctx context.Context, reference string) (Ledger, error) {
	var l Ledger
	path := "/ledger"
	if reference != "" {
		path += "?reference=" + url.QueryEscape(reference)
	}
	_, _, err := c.do(ctx, c.base, http.MethodGet, path, "", nil, &l)
	return l, err
}

// SetFaults replaces the provider's faults through its control listener.
func (c *Client) SetFaults(ctx context.Context, f Faults) (FaultStatus, error) {
	var st FaultStatus
	_, _, err := c.do(ctx, c.controlURL(), http.MethodPost, "/control/faults", "", f, &st)
	return st, err
}

// Faults reads the provider's faults and their counters.
func (c *Client) Faults(ctx context.Context) (FaultStatus, error) {
	var st FaultStatus
	_, _, err := c.do(ctx, c.controlURL(), http.MethodGet, "/control/faults", "", nil, &st)
	return st, err
}

func (c *Client) controlURL() string {
	if c.control == "" {
		return "control-url-not-set:"
	}
	return c.control
}

// do sends one request and decodes a 2xx body into out. For an error
// status it returns the problem body and the classified error.
func (c *Client) do(ctx context.Context, base, method, path, key string, in, out any) (*Problem, bool, error) {
	op := method + " " + strings.SplitN(path, "?", 2)[0]
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, false, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, body)
	if err != nil {
		return nil, false, fmt.Errorf("provider %s: %w", op, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
		// net/http silently resends a request that carries an
		// Idempotency-Key when a reused connection breaks. Every retry must
		// be the caller's decision (and visible to it), so make the request
		// not replayable.
		req.GetBody = nil
	}
	if key != "" {
		req.Header.Set(HeaderIdempotencyKey, key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		// No response: the request may have been executed (GETs too count
		// as unknown: the caller learnt nothing).
		return nil, false, &APIError{Op: op, Err: err, kind: ErrAmbiguous}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, false, &APIError{Op: op, Status: resp.StatusCode, Err: err, kind: ErrAmbiguous}
	}
	replayed := resp.Header.Get(HeaderIdempotentReplayed) == "true"
	if resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(raw, out); err != nil {
			return nil, replayed, &APIError{Op: op, Status: resp.StatusCode, Err: fmt.Errorf("decode response: %w", err), kind: ErrAmbiguous}
		}
		return nil, replayed, nil
	}
	e := &APIError{Op: op, Status: resp.StatusCode}
	var p Problem
	if json.Unmarshal(raw, &p) == nil && p.Status != 0 {
		e.Problem = &p
	}
	e.kind = classify(resp.StatusCode, e.Problem)
	return e.Problem, replayed, e
}

func classify(status int, p *Problem) error {
	typ := ""
	if p != nil {
		typ = strings.TrimPrefix(p.Type, ProblemTypeBase)
	}
	switch {
	case status == http.StatusPaymentRequired:
		return ErrDeclined
	case status == http.StatusBadRequest:
		return ErrInvalid
	case status == http.StatusUnprocessableEntity:
		return ErrKeyReused
	case status == http.StatusNotFound && typ == "lookup-unsupported":
		return ErrLookupUnsupported
	case status == http.StatusNotFound:
		return ErrNotFound
	case status == http.StatusConflict && typ == "request-in-progress":
		return ErrInProgress
	case status == http.StatusConflict:
		return ErrInvalid
	case status >= 500 || status == http.StatusRequestTimeout || status == http.StatusTooManyRequests:
		return ErrAmbiguous
	default:
		return ErrInvalid
	}
}
