package provider

// Charges and refunds: executing them, reading them back, and the lookups
// each mode offers.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// newID returns a new time-ordered id with prefix ("ch_", "re_").
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
