package provider

import (
	"fmt"
	"time"
)

// Mode is how the provider treats Idempotency-Key and lookups.
type Mode string

// The provider's modes.
const (
	// ModeIdempotent honours Idempotency-Key and answers lookups by key.
	ModeIdempotent Mode = "idempotent"
	// ModeQueryable ignores Idempotency-Key and answers lookups by reference.
	ModeQueryable Mode = "queryable"
	// ModeNeither ignores Idempotency-Key and answers no lookup.
	ModeNeither Mode = "neither"
)

// ParseMode returns the mode named s.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeIdempotent, ModeQueryable, ModeNeither:
		return m, nil
	}
	return "", fmt.Errorf("unknown provider mode %q (want idempotent, queryable or neither)", s)
}

// Charge statuses.
const (
	ChargeSucceeded = "succeeded"
	ChargeDeclined  = "declined"
)

// Refund statuses.
const (
	RefundSucceeded = "succeeded"
	RefundFailed    = "failed"
)

// Failure codes of declined charges and failed refunds.
const (
	// FailureAmountTooLarge: the charge's amount is over Config.DeclineAbove.
	FailureAmountTooLarge = "amount_too_large"
	// FailureNotCaptured: the refunded charge was declined.
	FailureNotCaptured = "charge_not_captured"
	// FailureExceedsRefundable: the refund asks for more than the charge's
	// amount minus its earlier refunds.
	FailureExceedsRefundable = "exceeds_refundable"
)

// ChargeRequest is the body of POST /charges.
type ChargeRequest struct {
	// Reference is the caller's id for what is paid (the order id).
	Reference string `json:"reference"`
	// Amount is in the currency's minor unit (cents), at least 1.
	Amount int64 `json:"amount"`
	// Currency is a three-letter lower-case ISO 4217 code ("eur").
	Currency string `json:"currency"`
}

// RefundRequest is the body of POST /refunds. Exactly one of Charge and
// Reference names the refunded charge; by reference, the reference must have
// exactly one captured charge.
type RefundRequest struct {
	Charge    string `json:"charge,omitempty"`
	Reference string `json:"reference,omitempty"`
	// Amount to refund; 0 refunds what is left of the charge.
	Amount int64 `json:"amount,omitempty"`
}

// Charge is a charge as the provider returns it.
type Charge struct {
	ID             string    `json:"id"`
	Reference      string    `json:"reference"`
	Amount         int64     `json:"amount"`
	Currency       string    `json:"currency"`
	Status         string    `json:"status"`
	FailureCode    string    `json:"failure_code,omitempty"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	Created        time.Time `json:"created"`
	// Replayed is true when the response was replayed from an earlier
	// request with the same Idempotency-Key (from the Idempotent-Replayed
	// header; not part of the body).
	Replayed bool `json:"-"`
}

// Refund is a refund as the provider returns it.
type Refund struct {
	ID             string    `json:"id"`
	Charge         string    `json:"charge"`
	Reference      string    `json:"reference"`
	Amount         int64     `json:"amount"`
	Currency       string    `json:"currency"`
	Status         string    `json:"status"`
	FailureCode    string    `json:"failure_code,omitempty"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	Created        time.Time `json:"created"`
	// Replayed: see Charge.Replayed.
	Replayed bool `json:"-"`
}

// LedgerEntry is one movement of money: a captured charge or a succeeded
// refund (declines and failed refunds move nothing and are not in it).
type LedgerEntry struct {
	Seq            int64     `json:"seq"`
	Kind           string    `json:"kind"` // "charge" or "refund"
	ID             string    `json:"id"`   // the charge or refund id
	Charge         string    `json:"charge"`
	Reference      string    `json:"reference"`
	Amount         int64     `json:"amount"`
	Currency       string    `json:"currency"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	Time           time.Time `json:"time"`
}

// LedgerTotal sums the ledger of one reference and currency.
type LedgerTotal struct {
	Reference string `json:"reference"`
	Currency  string `json:"currency"`
	// Charges counts captured charges: more than one is a duplicate charge
	// (invariant I6 is broken).
	Charges  int   `json:"charges"`
	Captured int64 `json:"captured"`
	Refunds  int   `json:"refunds"`
	Refunded int64 `json:"refunded"`
	// Net is Captured minus Refunded.
	Net int64 `json:"net"`
}

// Ledger is the body of GET /ledger.
type Ledger struct {
	Entries []LedgerEntry `json:"entries"`
	Totals  []LedgerTotal `json:"totals"`
	// Duplicates counts captured charges beyond the first of each
	// reference: the double charges the provider made.
	Duplicates int `json:"duplicates"`
}
