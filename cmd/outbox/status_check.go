package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pgoutbox/outbox"
)

// statusCheck is what 'outbox status --check' decides: the outbox is
// healthy when a relay is alive, no pending event is older than
// maxPendingAge and at most maxQuarantined events are quarantined. The
// defaults are the shipped alerts' thresholds
// (deploy/prometheus/outbox-alerts.yml: OutboxNoRelayAlive,
// OutboxOldestPendingTooOld at 300 s, OutboxQuarantined).
type statusCheck struct {
	maxPendingAge  time.Duration
	maxQuarantined int64
}

// checkResult is the outcome of a check, as --json prints it.
type checkResult struct {
	OK       bool     `json:"ok"`
	Problems []string `json:"problems"`
}

// errCheckFailed is returned by 'outbox status --check' when the outbox is
// not healthy: exit code 1, the problems on stderr.
var errCheckFailed = errors.New("check failed")

// run checks st.
func (c statusCheck) run(st outbox.Status) checkResult {
	res := checkResult{Problems: []string{}}
	if st.RelaysAlive == 0 {
		res.Problems = append(res.Problems, fmt.Sprintf("no relay alive (%d pending): nothing publishes", st.Pending))
	}
	// The events parked behind a quarantined one are the quarantine's
	// problem, reported below (or tolerated by --max-quarantined): not
	// counted here (TestStatusCheckToleratedQuarantineFailsAsPendingAge).
	if age := time.Duration(st.OldestUnparkedAgeSeconds * float64(time.Second)); age > c.maxPendingAge {
		res.Problems = append(res.Problems, fmt.Sprintf("the oldest pending event not parked behind a quarantine is %s old (limit %s): committed events are not getting out",
			age.Round(time.Second), c.maxPendingAge))
	}
	if st.Quarantined > c.maxQuarantined {
		res.Problems = append(res.Problems, fmt.Sprintf("%d quarantined (limit %d), blocking %d later events: see 'outbox quarantine list'",
			st.Quarantined, c.maxQuarantined, st.BlockedByQuarantine))
	}
	res.OK = len(res.Problems) == 0
	return res
}

// err is nil when the check passed, else errCheckFailed with the problems
// (main prints it on stderr and exits 1).
func (r checkResult) err() error {
	if r.OK {
		return nil
	}
	return fmt.Errorf("%w: %s", errCheckFailed, strings.Join(r.Problems, "; "))
}
