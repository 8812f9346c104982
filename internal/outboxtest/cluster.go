package outboxtest

import (
	"testing"

	"github.com/pgoutbox/outbox/internal/pgcluster"
)

// PrivateCluster starts a private PostgreSQL cluster for one test (see
// package pgcluster) and closes it when the test ends, showing its log if
// the test failed. Missing server binaries fail the test: it never skips.
func PrivateCluster(t testing.TB, cfg pgcluster.Config) *pgcluster.Cluster {
	t.Helper()
	c, err := pgcluster.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("private cluster's log:\n%s", c.Log())
		}
		if err := c.Close(); err != nil {
			t.Logf("close the private cluster: %v", err)
		}
	})
	return c
}
