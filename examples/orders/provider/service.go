package provider

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/examples/orders/ordersdb"
	"github.com/pgoutbox/outbox/internal/pgident"
)

// Defaults.
const (
	// SchemaDefault is the provider's schema.
	SchemaDefault = "provider"
	// DeclineAboveDefault is the largest amount charged; larger ones are
	// declined (10 000.00 in a two-decimal currency).
	DeclineAboveDefault = 1_000_000
)

// Limits on a request.
const (
	// MaxAmount is the largest amount a request may carry.
	MaxAmount = 1_000_000_000_000
	// MaxTextLength bounds references, ids and Idempotency-Key values.
	MaxTextLength = 255
)

// Config configures a Service.
type Config struct {
	// Schema holds the provider's tables. Defaults to SchemaDefault.
	Schema string
	// Mode defaults to ModeIdempotent.
	Mode Mode
	// DeclineAbove: a charge of a larger amount is declined. Defaults to
	// DeclineAboveDefault.
	DeclineAbove int64
	// Faults are injected from the start (SetFaults changes them).
	Faults Faults
	// Crash ends the process for an injected crash. Defaults to SIGKILL of
	// the process itself; tests running the provider in-process replace it.
	Crash func()
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Service is the fake payment provider. It is safe for concurrent use.
type Service struct {
	pool   *pgxpool.Pool
	cfg    Config
	log    *slog.Logger
	faults *injector
	q      queries

	mu       sync.Mutex
	inFlight map[string]bool // Idempotency-Keys being executed (idempotent mode)

	stopHanging     chan struct{}
	stopHangingOnce sync.Once
}

type queries struct {
	lockKey, selectKey, insertKey, insertCharge, insertRefund, insertLedger,
	selectCharge, chargeForUpdate, chargesOfReference, refunded,
	chargeByKey, refundByKey, selectRefund, refundsOfReference, ledger, ledgerOfReference string
}

// New returns a provider over pool. Call Migrate before the first request.
func New(pool *pgxpool.Pool, cfg Config) (*Service, error) {
	if pool == nil {
		return nil, errors.New("provider: New needs a pool")
	}
	if cfg.Schema == "" {
		cfg.Schema = SchemaDefault
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeIdempotent
	}
	if _, err := ParseMode(string(cfg.Mode)); err != nil {
		return nil, err
	}
	if cfg.DeclineAbove == 0 {
		cfg.DeclineAbove = DeclineAboveDefault
	}
	if cfg.Crash == nil {
		cfg.Crash = func() {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s, err := pgident.NewSchema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	faults := &injector{}
	if err := faults.set(cfg.Faults); err != nil {
		return nil, err
	}
	charges, refunds, keys, ledger := s.Table("provider_charges"), s.Table("provider_refunds"), s.Table("provider_idempotency_keys"), s.Table("provider_ledger")
	const chargeCols = `charge_id, reference, amount, currency, status, coalesce(failure_code, ''), coalesce(idempotency_key, ''), created_at`
	const refundCols = `r.refund_id, r.charge_id, c.reference, r.amount, c.currency, r.status, coalesce(r.failure_code, ''), coalesce(r.idempotency_key, ''), r.created_at`
	const ledgerCols = `entry_id, kind, object_id, charge_id, reference, amount, currency, coalesce(idempotency_key, ''), created_at`
	return &Service{
		pool: pool, cfg: cfg, log: cfg.Logger, faults: faults, inFlight: map[string]bool{}, stopHanging: make(chan struct{}),
		q: queries{
			// Advisory locks are per database: the schema keeps providers on
			// other schemas out of the key's lock.
			lockKey:   `SELECT pg_try_advisory_xact_lock(hashtextextended('provider.key.' || $2 || '.' || $1, 0))`,
			selectKey: `SELECT endpoint, request_hash, status_code, response FROM ` + keys + ` WHERE idempotency_key = $1`,
			insertKey: `INSERT INTO ` + keys + ` (idempotency_key, endpoint, request_hash, status_code, response, object_id) VALUES ($1, $2, $3, $4, $5, $6)`,
			insertCharge: `INSERT INTO ` + charges + ` (charge_id, reference, amount, currency, status, failure_code, idempotency_key)
VALUES ($1, $2, $3, $4, $5, nullif($6, ''), nullif($7, '')) RETURNING created_at`,
			insertRefund: `INSERT INTO ` + refunds + ` (refund_id, charge_id, amount, status, failure_code, idempotency_key)
VALUES ($1, $2, $3, $4, nullif($5, ''), nullif($6, '')) RETURNING created_at`,
			insertLedger: `INSERT INTO ` + ledger + ` (kind, object_id, charge_id, reference, amount, currency, idempotency_key, created_at)
VALUES ($1, $2, $3, $4, $5, $6, nullif($7, ''), $8)`,
			selectCharge:       `SELECT ` + chargeCols + ` FROM ` + charges + ` WHERE charge_id = $1`,
			chargeForUpdate:    `SELECT ` + chargeCols + ` FROM ` + charges + ` WHERE charge_id = $1 FOR UPDATE`,
			chargesOfReference: `SELECT ` + chargeCols + ` FROM ` + charges + ` WHERE reference = $1 ORDER BY created_at, charge_id`,
			refunded:           `SELECT coalesce(sum(amount), 0) FROM ` + refunds + ` WHERE charge_id = $1 AND status = 'succeeded'`,
			chargeByKey: `SELECT ` + chargeCols + ` FROM ` + charges + ` WHERE charge_id =
(SELECT object_id FROM ` + keys + ` WHERE idempotency_key = $1 AND endpoint = 'charges')`,
			refundByKey: `SELECT ` + refundCols + ` FROM ` + refunds + ` r JOIN ` + charges + ` c USING (charge_id) WHERE r.refund_id =
(SELECT object_id FROM ` + keys + ` WHERE idempotency_key = $1 AND endpoint = 'refunds')`,
			selectRefund:       `SELECT ` + refundCols + ` FROM ` + refunds + ` r JOIN ` + charges + ` c USING (charge_id) WHERE r.refund_id = $1`,
			refundsOfReference: `SELECT ` + refundCols + ` FROM ` + refunds + ` r JOIN ` + charges + ` c USING (charge_id) WHERE c.reference = $1 ORDER BY r.created_at, r.refund_id`,
			ledger:             `SELECT ` + ledgerCols + ` FROM ` + ledger + ` ORDER BY entry_id`,
			ledgerOfReference:  `SELECT ` + ledgerCols + ` FROM ` + ledger + ` WHERE reference = $1 ORDER BY entry_id`,
		},
	}, nil
}

// Migrate applies the provider's migrations to its schema.
func (s *Service) Migrate(ctx context.Context) error {
	_, err := ordersdb.Migrate(ctx, s.pool, s.cfg.Schema, ordersdb.Provider)
	return err
}

// StopHanging ends the waits of injected timeouts (their connections are
// closed without a response), so a server shutdown does not wait for them.
// Register it with http.Server.RegisterOnShutdown.
func (s *Service) StopHanging() {
	s.stopHangingOnce.Do(func() { close(s.stopHanging) })
}

// Mode returns the provider's mode.
func (s *Service) Mode() Mode { return s.cfg.Mode }

// ErrorKind classifies the requests the provider refuses or fails.
type ErrorKind int

// Error kinds; each maps to an HTTP status and a problem type.
const (
	// Invalid: the request breaks a validation rule (400); nothing written.
	Invalid ErrorKind = iota + 1
	// NotFound: no such charge or refund (404).
	NotFound
	// LookupUnsupported: the lookup is not offered in the provider's mode (404).
	LookupUnsupported
	// InProgress: a request with the same Idempotency-Key is being executed
	// (409); this one changed nothing.
	InProgress
	// KeyReused: the Idempotency-Key was used for a different request (422).
	KeyReused
	// AmbiguousReference: a refund by reference whose reference has several
	// captured charges (409).
	AmbiguousReference
	// Injected: a failure injected before the commit (500); nothing written.
	Injected
)

// Error is a request the provider refused or failed without writing.
type Error struct {
	Kind   ErrorKind
	Detail string
}

func (e *Error) Error() string { return e.Detail }

func refuse(kind ErrorKind, format string, args ...any) *Error {
	return &Error{Kind: kind, Detail: fmt.Sprintf(format, args...)}
}

// outcome is an executed request's answer: what was stored for its key.
type outcome struct {
	status   int
	body     []byte // JSON
	replayed bool
}

// hooks are the faults of one request, run by execute.
type hooks struct {
	beforeWork   func(ctx context.Context) error // latency
	beforeCommit func() error                    // error before commit
}

var currency = regexp.MustCompile(`^[a-z]{3}$`)

func checkText(field, v string, required bool) error {
	switch {
	case v == "" && required:
		return refuse(Invalid, "%s is required", field)
	case len(v) > MaxTextLength:
		return refuse(Invalid, "%s is longer than %d bytes", field, MaxTextLength)
	case !utf8.ValidString(v) || strings.ContainsRune(v, 0) || strings.ContainsRune(v, utf8.RuneError):
		return refuse(Invalid, "%s is not valid UTF-8 text", field)
	}
	return nil
}

// Validate checks a charge request.
func (r ChargeRequest) Validate() error {
	if err := checkText("reference", r.Reference, true); err != nil {
		return err
	}
	if r.Amount < 1 || r.Amount > MaxAmount {
		return refuse(Invalid, "amount must be between 1 and %d, not %d", int64(MaxAmount), r.Amount)
	}
	if !currency.MatchString(r.Currency) {
		return refuse(Invalid, "currency must be a three-letter lower-case code, not %q", r.Currency)
	}
	return nil
}

// Validate checks a refund request.
func (r RefundRequest) Validate() error {
	if (r.Charge == "") == (r.Reference == "") {
		return refuse(Invalid, "name exactly one of charge and reference")
	}
	if err := checkText("charge", r.Charge, false); err != nil {
		return err
	}
	if err := checkText("reference", r.Reference, false); err != nil {
		return err
	}
	if r.Amount < 0 || r.Amount > MaxAmount {
		return refuse(Invalid, "amount must be between 0 (all that is left) and %d, not %d", int64(MaxAmount), r.Amount)
	}
	return nil
}

// requestHash identifies a request's endpoint and content for idempotency:
// canonical JSON, so whitespace and field order do not matter.
func requestHash(endpoint string, req any) []byte {
	b, _ := json.Marshal(req)
	h := sha256.New()
	h.Write([]byte(endpoint))
	h.Write([]byte{0})
	h.Write(b)
	return h.Sum(nil)
}

// execute runs work in a transaction under the provider's idempotency rules.
// In idempotent mode with a key, a key in flight is refused, a stored key
// is replayed (or refused if its request differs), and the outcome is stored
// with the key in work's transaction.
func (s *Service) execute(ctx context.Context, endpoint, key string, req any, h hooks,
	work func(tx pgx.Tx) (status int, body any, objectID string, err error)) (outcome, error) {
	honour := key != "" && s.cfg.Mode == ModeIdempotent
	if honour {
		if !s.enter(key) {
			return outcome{}, refuse(InProgress, "a request with this Idempotency-Key is in progress; retry later")
		}
		defer s.leave(key)
	}
	if h.beforeWork != nil {
		if err := h.beforeWork(ctx); err != nil {
			return outcome{}, err
		}
	}
	hash := requestHash(endpoint, req)
	var out outcome
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if honour {
			// Another provider process on the same schema: the key is
			// locked for the transaction, and a holder makes this request
			// a conflict too.
			var locked bool
			if err := tx.QueryRow(ctx, s.q.lockKey, key, s.cfg.Schema).Scan(&locked); err != nil {
				return fmt.Errorf("lock idempotency key: %w", err)
			}
			if !locked {
				return refuse(InProgress, "a request with this Idempotency-Key is in progress; retry later")
			}
			var storedEndpoint string
			var storedHash []byte
			err := tx.QueryRow(ctx, s.q.selectKey, key).Scan(&storedEndpoint, &storedHash, &out.status, &out.body)
			if err == nil {
				if storedEndpoint != endpoint || !bytes.Equal(storedHash, hash) {
					return refuse(KeyReused, "this Idempotency-Key was used for a different request (POST /%s)", storedEndpoint)
				}
				out.replayed = true
				return runHook(h.beforeCommit)
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("read idempotency key: %w", err)
			}
		}
		status, body, id, err := work(tx)
		if err != nil {
			return err
		}
		if out.body, err = json.Marshal(body); err != nil {
			return err
		}
		out.status = status
		if honour {
			if _, err := tx.Exec(ctx, s.q.insertKey, key, endpoint, hash, status, out.body, id); err != nil {
				return fmt.Errorf("record idempotency key: %w", err)
			}
		}
		return runHook(h.beforeCommit)
	})
	if err != nil {
		return outcome{}, err
	}
	return out, nil
}

func runHook(f func() error) error {
	if f == nil {
		return nil
	}
	return f()
}

func (s *Service) enter(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight[key] {
		return false
	}
	s.inFlight[key] = true
	return true
}

func (s *Service) leave(key string) {
	s.mu.Lock()
	delete(s.inFlight, key)
	s.mu.Unlock()
}

func (s *Service) busy(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight[key]
}

// InFlight counts the Idempotency-Keys being executed now.
func (s *Service) InFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.inFlight)
}

func newID(prefix string) (string, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return "", err
	}
	return prefix + strings.ReplaceAll(id.String(), "-", ""), nil
}

// charge executes a validated charge request.
func (s *Service) charge(ctx context.Context, key string, req ChargeRequest, h hooks) (outcome, error) {
	return s.execute(ctx, "charges", key, req, h, func(tx pgx.Tx) (int, any, string, error) {
		id, err := newID("ch_")
		if err != nil {
			return 0, nil, "", err
		}
		c := Charge{ID: id, Reference: req.Reference, Amount: req.Amount, Currency: req.Currency, Status: ChargeSucceeded, IdempotencyKey: key}
		if req.Amount > s.cfg.DeclineAbove {
			c.Status, c.FailureCode = ChargeDeclined, FailureAmountTooLarge
		}
		if err := tx.QueryRow(ctx, s.q.insertCharge, c.ID, c.Reference, c.Amount, c.Currency, c.Status, c.FailureCode, key).Scan(&c.Created); err != nil {
			return 0, nil, "", fmt.Errorf("insert charge: %w", err)
		}
		c.Created = c.Created.UTC()
		if c.Status == ChargeDeclined {
			return 402, declined(c), c.ID, nil
		}
		if _, err := tx.Exec(ctx, s.q.insertLedger, "charge", c.ID, c.ID, c.Reference, c.Amount, c.Currency, key, c.Created); err != nil {
			return 0, nil, "", fmt.Errorf("insert ledger entry: %w", err)
		}
		return 201, c, c.ID, nil
	})
}

// refund executes a validated refund request.
func (s *Service) refund(ctx context.Context, key string, req RefundRequest, h hooks) (outcome, error) {
	return s.execute(ctx, "refunds", key, req, h, func(tx pgx.Tx) (int, any, string, error) {
		var c Charge
		if req.Charge != "" {
			err := scanCharge(tx.QueryRow(ctx, s.q.chargeForUpdate, req.Charge), &c)
			if errors.Is(err, pgx.ErrNoRows) {
				return 0, nil, "", refuse(NotFound, "no charge %q", req.Charge)
			}
			if err != nil {
				return 0, nil, "", fmt.Errorf("read charge: %w", err)
			}
		} else {
			cs, err := collectCharges(tx.Query(ctx, s.q.chargesOfReference+" FOR UPDATE", req.Reference))
			if err != nil {
				return 0, nil, "", fmt.Errorf("read charges: %w", err)
			}
			var captured []Charge
			for _, x := range cs {
				if x.Status == ChargeSucceeded {
					captured = append(captured, x)
				}
			}
			switch len(captured) {
			case 0:
				return 0, nil, "", refuse(NotFound, "no captured charge has reference %q", req.Reference)
			case 1:
				c = captured[0]
			default:
				return 0, nil, "", refuse(AmbiguousReference, "reference %q has %d captured charges; refund by charge id", req.Reference, len(captured))
			}
		}
		id, err := newID("re_")
		if err != nil {
			return 0, nil, "", err
		}
		var refunded int64
		if err := tx.QueryRow(ctx, s.q.refunded, c.ID).Scan(&refunded); err != nil {
			return 0, nil, "", fmt.Errorf("sum refunds: %w", err)
		}
		r := Refund{ID: id, Charge: c.ID, Reference: c.Reference, Amount: req.Amount, Currency: c.Currency, Status: RefundSucceeded, IdempotencyKey: key}
		left := c.Amount - refunded
		if r.Amount == 0 {
			r.Amount = left
		}
		switch {
		case c.Status != ChargeSucceeded:
			r.Status, r.FailureCode = RefundFailed, FailureNotCaptured
		case left == 0 || r.Amount > left:
			r.Status, r.FailureCode = RefundFailed, FailureExceedsRefundable
		}
		if err := tx.QueryRow(ctx, s.q.insertRefund, r.ID, r.Charge, r.Amount, r.Status, r.FailureCode, key).Scan(&r.Created); err != nil {
			return 0, nil, "", fmt.Errorf("insert refund: %w", err)
		}
		r.Created = r.Created.UTC()
		if r.Status == RefundFailed {
			return 402, failedRefund(r), r.ID, nil
		}
		if _, err := tx.Exec(ctx, s.q.insertLedger, "refund", r.ID, r.Charge, r.Reference, r.Amount, r.Currency, key, r.Created); err != nil {
			return 0, nil, "", fmt.Errorf("insert ledger entry: %w", err)
		}
		return 201, r, r.ID, nil
	})
}

type rowScanner interface{ Scan(dest ...any) error }

func scanCharge(row rowScanner, c *Charge) error {
	if err := row.Scan(&c.ID, &c.Reference, &c.Amount, &c.Currency, &c.Status, &c.FailureCode, &c.IdempotencyKey, &c.Created); err != nil {
		return err
	}
	c.Created = c.Created.UTC()
	return nil
}

func scanRefund(row rowScanner, r *Refund) error {
	if err := row.Scan(&r.ID, &r.Charge, &r.Reference, &r.Amount, &r.Currency, &r.Status, &r.FailureCode, &r.IdempotencyKey, &r.Created); err != nil {
		return err
	}
	r.Created = r.Created.UTC()
	return nil
}

func collectCharges(rows pgx.Rows, err error) ([]Charge, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Charge, error) {
		var c Charge
		return c, scanCharge(row, &c)
	})
}

// GetCharge reads a charge by id.
func (s *Service) GetCharge(ctx context.Context, id string) (Charge, error) {
	var c Charge
	err := scanCharge(s.pool.QueryRow(ctx, s.q.selectCharge, id), &c)
	if errors.Is(err, pgx.ErrNoRows) {
		return Charge{}, refuse(NotFound, "no charge %q", id)
	}
	return c, err
}

// GetRefund reads a refund by id.
func (s *Service) GetRefund(ctx context.Context, id string) (Refund, error) {
	var r Refund
	err := scanRefund(s.pool.QueryRow(ctx, s.q.selectRefund, id), &r)
	if errors.Is(err, pgx.ErrNoRows) {
		return Refund{}, refuse(NotFound, "no refund %q", id)
	}
	return r, err
}

// ChargeByKey returns the charge made by the request with Idempotency-Key
// key (idempotent mode only). A key in flight is InProgress; a key the
// provider has no outcome for is NotFound: no charge was committed for it.
func (s *Service) ChargeByKey(ctx context.Context, key string) (Charge, error) {
	if err := s.lookupByKey(key); err != nil {
		return Charge{}, err
	}
	var c Charge
	err := scanCharge(s.pool.QueryRow(ctx, s.q.chargeByKey, key), &c)
	if errors.Is(err, pgx.ErrNoRows) {
		return Charge{}, refuse(NotFound, "no charge was made with this Idempotency-Key")
	}
	return c, err
}

// RefundByKey is ChargeByKey for refunds.
func (s *Service) RefundByKey(ctx context.Context, key string) (Refund, error) {
	if err := s.lookupByKey(key); err != nil {
		return Refund{}, err
	}
	var r Refund
	err := scanRefund(s.pool.QueryRow(ctx, s.q.refundByKey, key), &r)
	if errors.Is(err, pgx.ErrNoRows) {
		return Refund{}, refuse(NotFound, "no refund was made with this Idempotency-Key")
	}
	return r, err
}

func (s *Service) lookupByKey(key string) error {
	if s.cfg.Mode != ModeIdempotent {
		return refuse(LookupUnsupported, "lookup by Idempotency-Key is not offered in %s mode", s.cfg.Mode)
	}
	if err := checkText("key", key, true); err != nil {
		return err
	}
	if s.busy(key) {
		return refuse(InProgress, "the request with this Idempotency-Key is in progress; ask again later")
	}
	return nil
}

// ChargesOfReference lists the charges (captured and declined) of a
// reference, oldest first (queryable mode only).
func (s *Service) ChargesOfReference(ctx context.Context, reference string) ([]Charge, error) {
	if err := s.lookupByReference(reference); err != nil {
		return nil, err
	}
	return collectCharges(s.pool.Query(ctx, s.q.chargesOfReference, reference))
}

// RefundsOfReference lists the refunds of a reference's charges, oldest
// first (queryable mode only).
func (s *Service) RefundsOfReference(ctx context.Context, reference string) ([]Refund, error) {
	if err := s.lookupByReference(reference); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, s.q.refundsOfReference, reference)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Refund, error) {
		var r Refund
		return r, scanRefund(row, &r)
	})
}

func (s *Service) lookupByReference(reference string) error {
	if s.cfg.Mode != ModeQueryable {
		return refuse(LookupUnsupported, "lookup by reference is not offered in %s mode", s.cfg.Mode)
	}
	return checkText("reference", reference, true)
}

// Ledger reads the ledger, of one reference when reference is not empty,
// with its totals. It is available in every mode: it is the witness the
// tests and the checker read, not part of a real provider's API.
func (s *Service) Ledger(ctx context.Context, reference string) (Ledger, error) {
	var rows pgx.Rows
	var err error
	if reference == "" {
		rows, err = s.pool.Query(ctx, s.q.ledger)
	} else {
		rows, err = s.pool.Query(ctx, s.q.ledgerOfReference, reference)
	}
	if err != nil {
		return Ledger{}, fmt.Errorf("read ledger: %w", err)
	}
	entries, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (LedgerEntry, error) {
		var e LedgerEntry
		err := row.Scan(&e.Seq, &e.Kind, &e.ID, &e.Charge, &e.Reference, &e.Amount, &e.Currency, &e.IdempotencyKey, &e.Time)
		e.Time = e.Time.UTC()
		return e, err
	})
	if err != nil {
		return Ledger{}, fmt.Errorf("read ledger: %w", err)
	}
	return summarise(entries), nil
}

// summarise totals ledger entries per reference and currency, in order of
// first appearance.
func summarise(entries []LedgerEntry) Ledger {
	l := Ledger{Entries: entries, Totals: []LedgerTotal{}}
	if l.Entries == nil {
		l.Entries = []LedgerEntry{}
	}
	idx := map[[2]string]int{}
	for _, e := range entries {
		k := [2]string{e.Reference, e.Currency}
		i, ok := idx[k]
		if !ok {
			i = len(l.Totals)
			idx[k] = i
			l.Totals = append(l.Totals, LedgerTotal{Reference: e.Reference, Currency: e.Currency})
		}
		t := &l.Totals[i]
		switch e.Kind {
		case "charge":
			t.Charges++
			t.Captured += e.Amount
			if t.Charges > 1 {
				l.Duplicates++
			}
		case "refund":
			t.Refunds++
			t.Refunded += e.Amount
		}
		t.Net = t.Captured - t.Refunded
	}
	return l
}
