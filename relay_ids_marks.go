package outbox

// Marking in the background: a PublishIDs call whose events the destination
// all acknowledged returns once it has the acks, and its marks are written
// while the caller reads on and the next call claims and publishes. The
// argument: docs/design.md, "Change-data capture".

import (
	"context"
	"fmt"

	"github.com/google/uuid"
)

// idsMarks is the mark of one PublishIDs call's acknowledged events, being
// written in the background. Marks are written in call order: a call waits
// for the previous call's marks before it settles its own.
type idsMarks struct {
	done  chan struct{}
	acked []uuid.UUID // acknowledged by the destination, being marked
	err   error       // set before done is closed
}

// markInBackground starts marking b's events, all of them acknowledged, and
// returns at once. The next call's claim counts them as published
// (claimIDsSQL's $5) until the marks are written: the destination has them,
// so a successor goes out after them, as it would once they are marked.
func (r *Relay) markInBackground(ctx context.Context, b batch, published []uuid.UUID) {
	m := &idsMarks{done: make(chan struct{}), acked: published}
	r.idsMarks = m
	go func() {
		defer close(m.done)
		if r.testHookMarks != nil {
			r.testHookMarks()
		}
		n, err := r.settled(context.WithoutCancel(ctx), b, SettleMarkPublished, r.sql.markPublished, published)
		if err != nil {
			m.err = fmt.Errorf("mark published: %w", err)
			return
		}
		r.published.Add(n)
		if lost := int64(len(published)) - n; lost > 0 {
			// Another relay took events over before their mark (it was
			// slower than their lease) and publishes them again. The next
			// call claimed their successors counting them as published: it
			// must not mark those while these are not.
			m.err = fmt.Errorf("mark published: %d of %d acknowledged events were taken over by another relay before their mark landed", lost, len(published))
		}
	}()
}

// pendingMarks returns the ids of the previous call's marks while they are
// being written, or the error they ended with (once: the marks are then
// forgotten). Called with idsMu held.
func (r *Relay) pendingMarks() ([]uuid.UUID, error) {
	m := r.idsMarks
	if m == nil {
		return nil, nil
	}
	select {
	case <-m.done:
		r.idsMarks = nil
		return nil, m.err
	default:
		return m.acked, nil
	}
}

// awaitMarks waits for the previous call's marks and returns their error.
// Called with idsMu held.
func (r *Relay) awaitMarks(ctx context.Context) error {
	m := r.idsMarks
	if m == nil {
		return nil
	}
	select {
	case <-m.done:
	default:
		select {
		case <-m.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.idsMarks = nil
	return m.err
}

// WaitPublishIDs waits until the marks of the last PublishIDs call, which it
// writes in the background once the destination acknowledged every event
// of the call, are written, and returns their error (a database error; the
// events then stay unpublished in the table, under their lease, and are
// published again once it expires: at least once). A caller that stops
// calling PublishIDs calls it before it reports the events as done, or
// exits; a failed mark is also returned by the next PublishIDs call.
func (r *Relay) WaitPublishIDs(ctx context.Context) error {
	r.idsMu.Lock()
	defer r.idsMu.Unlock()
	return r.awaitMarks(ctx)
}
