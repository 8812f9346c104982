package provider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"unicode/utf8"

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
	// OnFault, when set, is called with the request and the fault drawn
	// for it, before the fault is injected: a caller in the same process
	// (outbox demo) labels the errors it causes as injected.
	OnFault func(r *http.Request, fault FaultKind)
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
