//go:build race

package outbox_test

// ilvRace: the tests run with the race detector, which makes a schedule
// about five times slower.
const ilvRace = true
