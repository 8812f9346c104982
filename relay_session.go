package outbox

// RelaySessionParams are the session settings a relay's own connection pool
// should have (pgxpool: ConnConfig.RuntimeParams). "outbox relay" uses them.
//
//   - jit=off: the claim is a short OLTP statement, and JIT compilation,
//     which PostgreSQL starts for plans estimated above jit_above_cost (a
//     large backlog gets there), adds tens of milliseconds to each claim.
//   - synchronous_commit=off, unless syncCommit: claims, marks and failure
//     records then do not wait for the WAL flush (an fsync per round trip).
//     A database crash may lose the last few of them; that only republishes
//     events (at-least-once, with the same ids) or repeats an attempt, and
//     WAL order keeps marks in order, so k+1 is never left marked while k is
//     not. Never set it on the pool your writers use: the business
//     transaction and its events must be durable at commit.
func RelaySessionParams(syncCommit bool) map[string]string {
	p := map[string]string{"jit": "off"}
	if !syncCommit {
		p["synchronous_commit"] = "off"
	}
	return p
}
