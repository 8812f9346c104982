package outbox

import (
	"crypto/sha256"
	"encoding/hex"
)

// maxChannelBytes is PostgreSQL's identifier limit (NAMEDATALEN-1): LISTEN
// truncates a longer channel name and pg_notify refuses it.
const maxChannelBytes = 63

const notifyChannelPrefix = "outbox_events_"

// NotifyChannel is the LISTEN/NOTIFY channel a relay of schema listens on
// and writers, notifiers and Admin notify. It is "outbox_events_<schema>"
// when that fits PostgreSQL's 63-byte identifier limit (schema names of up
// to 49 bytes). For a longer schema name it is
// "outbox_events_<first 32 bytes of schema>_<16 hex digits>", the digits
// being the start of the SHA-256 of the full schema name: always 63 bytes,
// the same in every process, and distinct for two long schemas that share
// their first 32 bytes.
func NotifyChannel(schema string) string {
	if len(notifyChannelPrefix)+len(schema) <= maxChannelBytes {
		return notifyChannelPrefix + schema
	}
	sum := sha256.Sum256([]byte(schema))
	hash := hex.EncodeToString(sum[:8])
	keep := maxChannelBytes - len(notifyChannelPrefix) - 1 - len(hash)
	return notifyChannelPrefix + schema[:keep] + "_" + hash
}
