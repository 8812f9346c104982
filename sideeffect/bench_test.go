package sideeffect_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/sideeffect"
)

// BenchmarkDo measures what the helper adds around a call that succeeds at
// once (the call itself costs nothing here): the claim (one INSERT) and the
// record (one UPDATE), two commits. BenchmarkDoReplay: a key already
// succeeded, answered from the record (one INSERT ... ON CONFLICT and one
// locked read).
func BenchmarkDo(b *testing.B) {
	pool, schema := outboxtest.Schema(b)
	c, err := sideeffect.New(pool, sideeffect.Config{Name: "bench", Schema: schema, Mode: sideeffect.Idempotent})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	call := func(context.Context, string) ([]byte, error) { return []byte(`{"ok":true}`), nil }
	req := []byte(`{"amount":1299}`)
	b.Run("new key", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, err := c.Do(ctx, "k"+strconv.Itoa(i), req, call); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		if _, err := c.Do(ctx, "replayed", req, call); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if res, err := c.Do(ctx, "replayed", req, call); err != nil || !res.Replayed {
				b.Fatal(res, err)
			}
		}
	})
}
