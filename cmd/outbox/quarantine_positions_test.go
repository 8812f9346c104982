package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/operatortest"
)

// cliOperator acts through `outbox quarantine retry|skip`: a refusal is a
// one-line error on stderr with exit code 1.
type cliOperator struct {
	t      *testing.T
	schema string
}

func (o cliOperator) run(args ...string) error {
	o.t.Helper()
	stdout, stderr, code := runOutbox(o.t, nil, append(args, "--schema", o.schema, "--by", "tester")...)
	switch {
	case code == 0:
		return nil
	case code != 1 || strings.Count(strings.TrimSpace(stderr), "\n") != 0:
		o.t.Errorf("outbox %v: exit %d, stderr %q (stdout %q); want exit 1 and one line", args, code, stderr, stdout)
	}
	o.t.Logf("outbox %v refused: %s", args, strings.TrimSpace(stderr))
	return errors.New(stderr)
}

func (o cliOperator) Retry(id uuid.UUID) error { return o.run("quarantine", "retry", id.String()) }

func (o cliOperator) Skip(id uuid.UUID, reason string) error {
	return o.run("quarantine", "skip", id.String(), "--reason", reason)
}

// TestQuarantineSkipAndRetryAtAnyPosition is the regression test of issue
// 19, item 2, through `outbox quarantine`: a skip of a quarantined event
// behind an unsettled one is refused in one line naming that event, and no
// event reaches the destination before an earlier one. See
// operatortest.LanePositions.
func TestQuarantineSkipAndRetryAtAnyPosition(t *testing.T) {
	t.Parallel()
	operatortest.LanePositions(t, func(t *testing.T, _ *pgxpool.Pool, schema string) operatortest.Operator {
		return cliOperator{t: t, schema: schema}
	})
}
