package sideeffect

import (
	"context"
	"fmt"
	"time"

	"github.com/pgoutbox/outbox/internal/pgtx"
)

// OpenCursor is where a page of open attempts ends; pass it as
// OpenFilter.After for the next page.
type OpenCursor struct {
	Name      string    `json:"name"`
	NextCheck time.Time `json:"next_check_at"`
	Key       string    `json:"key"`
}

// OpenFilter narrows Admin.Open.
type OpenFilter struct {
	// Name, when set, restricts the list to that name.
	Name string
	// Limit is the most attempts listed. Defaults to 100.
	Limit int
	// After, when set, starts after that attempt (the previous page's Next).
	After *OpenCursor
}

// OpenPage is one page of open attempts.
type OpenPage struct {
	Attempts []Attempt `json:"attempts"`
	// Next is set when more follow.
	Next *OpenCursor `json:"next,omitempty"`
}

// Open lists the attempts not settled and not parked: started ones (a call
// or a lookup under way; Attempt.Expired when the caller's lease ended, so
// that it counts as unknown) and unknown ones, by name, then next check
// (the reconciler's order), then key, a page at a time. It reads the
// partial index of open attempts (side_effects_due_idx), so a page costs
// the same however many attempts are finished.
func (a *Admin) Open(ctx context.Context, f OpenFilter) (OpenPage, error) {
	if f.Limit < 0 {
		return OpenPage{}, fmt.Errorf("sideeffect: open: limit %d is negative", f.Limit)
	}
	if f.Limit == 0 {
		f.Limit = 100
	}
	// Open attempts always have a next check (the lease's end for a started
	// one, the backoff's for an unknown one), so the keyset order leaves
	// none out. The first page has no cursor condition at all, so that the
	// index's order is read from its start.
	cond, args := "", []any{f.Name, f.Limit + 1}
	if f.After != nil {
		cond = ` AND (name, next_check_at, key) > ($3, $4, $5)`
		args = append(args, f.After.Name, f.After.NextCheck, f.After.Key)
	}
	rows, err := a.db.Query(ctx, `SELECT `+attemptColumns+` FROM `+a.t+`
WHERE state IN ('started', 'unknown') AND ($1 = '' OR name = $1)`+cond+`
ORDER BY name, next_check_at, key
LIMIT $2`, args...)
	if err != nil {
		return OpenPage{}, fmt.Errorf("sideeffect: open attempts of schema %s: %w", a.schema.Name(), err)
	}
	list, err := pgtx.Collect(rows, func(row pgtx.Row) (Attempt, error) { return scanAttempt(row) })
	if err != nil {
		return OpenPage{}, fmt.Errorf("sideeffect: open attempts of schema %s: %w", a.schema.Name(), err)
	}
	page := OpenPage{Attempts: list}
	if len(list) > f.Limit {
		page.Attempts = list[:f.Limit]
		last := page.Attempts[f.Limit-1]
		c := OpenCursor{Name: last.Name, Key: last.Key}
		if last.NextCheck != nil {
			c.NextCheck = *last.NextCheck
		}
		page.Next = &c
	}
	return page, nil
}
