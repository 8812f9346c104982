package outboxtest

import (
	"os"
	"strings"
)

// NoRaceExitSleep makes the race-built binaries a test starts (they
// inherit the environment) exit as soon as they are done: the race
// runtime sleeps a second at every clean exit (its atexit_sleep_ms, 1000
// by default, lets other threads finish a report), which was most of the
// time of a run of `outbox --help` or `outbox version`, and a second of
// every relay stopped with SIGTERM. A race report still makes the process
// exit with status 66. A GORACE that sets atexit_sleep_ms is left alone.
// Call it from TestMain, before the tests start.
func NoRaceExitSleep() {
	g := os.Getenv("GORACE")
	if strings.Contains(g, "atexit_sleep_ms") {
		return
	}
	_ = os.Setenv("GORACE", strings.TrimSpace(g+" atexit_sleep_ms=0"))
}
