//go:build outbox_brokenmark

package main

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
)

// brokenBuild is a DELIBERATE BUG, compiled only with -tags
// outbox_brokenmark, so that internal/chaos's TestChaosCatchesBrokenBuild
// can show the chaos checker catches it: the relay's events are marked
// published before the broker acknowledged them. A crash, a broker outage
// or a refused publish then loses them (I3).
func brokenBuild(pool *pgxpool.Pool, schema string, pub outbox.Publisher) outbox.Publisher {
	table := pgx.Identifier{schema, "outbox_events"}.Sanitize()
	return outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		ids := make([]uuid.UUID, len(msgs))
		for i, m := range msgs {
			ids[i] = m.ID
		}
		_, _ = pool.Exec(ctx, `UPDATE `+table+` SET published_at = now() WHERE event_id = ANY($1)`, ids)
		return pub.Publish(ctx, msgs)
	})
}
