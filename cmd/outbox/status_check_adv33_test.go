package main

// Adversarial review (stop 33) of 'outbox status --check' (bd4de1d).

import (
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
)

// TestStatusCheckToleratedQuarantineFailsAsPendingAge: an operator raises
// --max-quarantined to 1 (one known poison event, left for later). The
// events of its aggregate written after it are parked behind it: Status
// counts them as Pending and in OldestPendingAgeSeconds (admin.go:
// backlogColumns takes min(occurred_at) of every unpublished event not
// quarantined, the blocked ones included) and in BlockedByQuarantine. Once
// they are five minutes old the check fails anyway, and says "the oldest
// pending event is 1h0m0s old: committed events are not getting out" - a
// relay problem - while the relays publish everything else and the only
// cause is the quarantine the operator tolerated. --max-quarantined N > 0
// cannot pass as soon as a tolerated quarantine blocks anything; the
// output points the on-call at the relays instead of the quarantine.
// (Status below is what Admin.Status returns for that outbox: one
// quarantined event, three events behind it written an hour ago, nothing
// else pending, a relay alive.)
func TestStatusCheckToleratedQuarantineFailsAsPendingAge(t *testing.T) {
	st := outbox.Status{RelaysAlive: 1, BlockedByQuarantine: 3,
		Backlog: outbox.Backlog{Pending: 3, Quarantined: 1, OldestPendingAgeSeconds: 3600, OldestUnparkedAgeSeconds: 0}}
	res := statusCheck{maxPendingAge: 5 * time.Minute, maxQuarantined: 1}.run(st)
	if !res.OK {
		t.Fatalf("--check --max-quarantined 1 fails on the events parked behind the tolerated quarantine: %s",
			strings.Join(res.Problems, "; "))
	}
}
