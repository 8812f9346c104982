package provider

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

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
