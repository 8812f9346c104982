//go:build !race

package outbox_test

const ilvRace = false
