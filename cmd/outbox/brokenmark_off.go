//go:build !outbox_brokenmark

package main

import (
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
)

// brokenBuild returns pub: the relay is only broken in builds with -tags
// outbox_brokenmark (see brokenmark.go), which the chaos checker's own test
// uses to show that it catches a relay marking events before the ack.
func brokenBuild(_ *pgxpool.Pool, _ string, pub outbox.Publisher) outbox.Publisher { return pub }
