package chaos

// Optional methods a Destination may have, for what only some kinds need.
// They are separate interfaces so that the kinds without them stay as they
// are.

// envDestination is a Destination whose relays and consumers need
// environment variables, such as a signing secret.
type envDestination interface {
	// Env returns "KEY=value" pairs for a process of role. Values may be
	// secrets: they are never printed.
	Env(role string) []string
}

// consumerLimited is a Destination that only so many consumer processes can
// read from at once.
type consumerLimited interface {
	// MaxConsumers is the most consumer processes, and why, for the
	// output.
	MaxConsumers() (n int, why string)
}

// restartNoted is a Destination that says why it has no broker restarts.
type restartNoted interface {
	// NoRestarts is the reason, for the output.
	NoRestarts() string
}

// DestinationEnv returns the environment variables d's processes of role
// need besides their parent's (none for most kinds). Values may be
// secrets: never print them.
func DestinationEnv(d Destination, role string) []string {
	if e, ok := d.(envDestination); ok {
		return e.Env(role)
	}
	return nil
}

// DestinationEnvNames are the variables any DestinationEnv may set, which a
// process must not inherit from its parent.
var DestinationEnvNames = []string{"OUTBOX_WEBHOOK_SECRET"}

// maxConsumers returns how many of want consumer processes d takes, and
// why fewer (or "").
func maxConsumers(d Destination, want int) (int, string) {
	if l, ok := d.(consumerLimited); ok {
		if n, why := l.MaxConsumers(); n > 0 && want > n {
			return n, why
		}
	}
	return want, ""
}

// noRestartsNote is why d has no broker restarts, for the output.
func noRestartsNote(d Destination) string {
	if n, ok := d.(restartNoted); ok {
		return n.NoRestarts()
	}
	return "the harness cannot restart this destination without losing its data"
}
