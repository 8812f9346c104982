package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/operatortest"
)

// adminOperator acts through the Admin API; a skip it refuses must be
// ErrNotLaneHead.
type adminOperator struct {
	t     *testing.T
	admin *outbox.Admin
}

func (o adminOperator) Retry(id uuid.UUID) error {
	_, err := o.admin.Retry(context.Background(), id, "tester")
	return err
}

func (o adminOperator) Skip(id uuid.UUID, reason string) error {
	_, err := o.admin.Skip(context.Background(), id, "tester", reason)
	if err != nil && !errors.Is(err, outbox.ErrNotLaneHead) {
		o.t.Errorf("skip of %s: %v, want nil or ErrNotLaneHead", id, err)
	}
	return err
}

// TestAdminSkipAndRetryAtAnyPosition is the regression test of issue 19,
// item 2, through the Admin API: a skip of a quarantined event behind an
// unsettled one (pending, or quarantined) is refused with ErrNotLaneHead,
// so the events after it never reach the destination before the earlier
// one; a retry is accepted anywhere. See operatortest.LanePositions.
func TestAdminSkipAndRetryAtAnyPosition(t *testing.T) {
	t.Parallel()
	forAdminKinds(t, func(t *testing.T, k adminKind) {
		operatortest.LanePositions(t, func(t *testing.T, pool *pgxpool.Pool, schema string) operatortest.Operator {
			return adminOperator{t: t, admin: k.newAdmin(t, pool, schema)}
		})
	})
}
