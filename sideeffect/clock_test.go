package sideeffect_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/sideeffect"
)

// Config.Clock is the clock Do's lease check reads: a caller whose clock
// says its claim's lease has run out by the time it would call refuses to
// call (ErrLeaseExpired), whatever the wall clock says. The interleaving
// search (TestInterleavings) moves it with the database's now(), so that a
// tick past the lease is a caller paused past it.
func TestClockDecidesTheLeaseCheck(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	ctx := context.Background()
	// A call must start within (Lease - CallTimeout)/2 of the claim on
	// the unmoved clock: a minute's lease leaves 29.5 s, room for a loaded
	// machine (3 s left one second); the moved clock jumps a whole lease.
	const lease = time.Minute
	for _, jump := range []time.Duration{0, lease} {
		var readings atomic.Int64
		clock := func() time.Time {
			// The claim reads the clock first; every later reading is
			// jump later, as if the caller paused that long after it.
			if readings.Add(1) == 1 {
				return time.Now()
			}
			return time.Now().Add(jump)
		}
		c, err := sideeffect.New(pool, sideeffect.Config{Name: "clock.test", Schema: schema, Mode: sideeffect.Idempotent,
			CallTimeout: time.Second, Lease: lease, Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		calls := 0
		res, err := c.Do(ctx, uuid.NewString(), []byte("x"), func(context.Context, string) ([]byte, error) {
			calls++
			return []byte("ok"), nil
		})
		switch {
		case jump == 0 && (err != nil || calls != 1 || res.State != sideeffect.Succeeded):
			t.Errorf("clock not moved: %+v, %v, %d calls; want one call, succeeded", res, err, calls)
		case jump > 0 && (!errors.Is(err, sideeffect.ErrLeaseExpired) || calls != 0 || res.Called):
			t.Errorf("clock moved past the lease after the claim: %+v, %v, %d calls; want ErrLeaseExpired and no call", res, err, calls)
		}
	}
}
