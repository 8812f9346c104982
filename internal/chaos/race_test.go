//go:build race

package chaos

// raceEnabled: the tests run with -race, so the binaries they run are built
// with it too.
const raceEnabled = true
