package main

import (
	"strings"
	"testing"
)

// checkDemoAckDurable checks the demo's logs (at info level) for the
// relay's durability check: it ran, found the embedded server's
// acknowledgement durable (every write fsynced, seen through its
// monitoring endpoint), and nothing warned.
func checkDemoAckDurable(t *testing.T, logs string) {
	t.Helper()
	if strings.Contains(logs, "destination acknowledgement is not durable") {
		t.Errorf("the demo warned that its broker's acknowledgement is not durable:\n%s", logs)
	}
	found := false
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, `msg="destination acknowledgement is durable"`) && strings.Contains(line, "reason=sync_always") {
			found = true
		}
	}
	if !found {
		t.Errorf("the demo's relay did not find its embedded server's acknowledgement durable (sync_always); logs:\n%s", logs)
	}
}
