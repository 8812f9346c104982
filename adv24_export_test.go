package outbox

import "time"

// Adv24FullScanDue reports whether the relay's next claim starts a
// background full scan (for the timing of TestAdv24CompleteLookSpacedByALockWait:
// it changes nothing).
func (r *Relay) Adv24FullScanDue() bool {
	return r.claimKind(time.Now()) == claimFull && r.backgroundFullScan()
}
