package inbox

import "time"

// SetStartSkew sets how much earlier than the start point an event must
// have occurred to count as before it (a minute outside tests), so that a
// test need not hold a transaction open for a minute.
func SetStartSkew(in *Inbox, d time.Duration) { in.startSkew = d }
