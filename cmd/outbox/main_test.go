package main

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestMain starts building the outbox binary (buildOutbox, with -race) as
// the package's tests start, when they all run (no -run): the tests that
// run it are parallel ones, which run after every serial test (the demos,
// in this process), so the build, a minute of CI's 2-core machine, overlaps
// those instead of adding to them. It removes the binary at the end. The
// binaries the tests run skip the race runtime's second of sleep at a
// clean exit (outboxtest.NoRaceExitSleep): TestCommandsNeverShowDatabaseSecrets
// alone runs the binary 74 times.
func TestMain(m *testing.M) {
	outboxtest.NoRaceExitSleep()
	flag.Parse()
	if f := flag.Lookup("test.run"); f != nil && f.Value.String() == "" {
		go buildOutbox()
	}
	code := m.Run()
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}
