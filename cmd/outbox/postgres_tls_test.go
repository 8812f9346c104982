package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/pgcluster"
	"github.com/pgoutbox/outbox/internal/testcert"
)

// tlsCluster starts a private PostgreSQL cluster that accepts only TLS
// connections from clients with a certificate its CA signed (pg_hba
// "hostssl ... cert", "hostnossl ... reject"), and returns it with that CA
// and a client certificate for the postgres user.
func tlsCluster(t *testing.T) (*pgcluster.Cluster, *testcert.CA, testcert.Pair) {
	t.Helper()
	ca := testcert.NewCA(t, "pg")
	server := ca.Server(t, "server")
	client := ca.Client(t, "client", "postgres")
	cluster := outboxtest.PrivateCluster(t, pgcluster.Config{
		Settings: map[string]string{
			"ssl": "on", "ssl_cert_file": "server.crt", "ssl_key_file": "server.key", "ssl_ca_file": "root.crt",
		},
		Prepare: func(dataDir string) error {
			testcert.Copy(t, server.CertFile, filepath.Join(dataDir, "server.crt"), 0o600)
			testcert.Copy(t, server.KeyFile, filepath.Join(dataDir, "server.key"), 0o600)
			testcert.Copy(t, ca.CertFile, filepath.Join(dataDir, "root.crt"), 0o600)
			hba := "local all all trust\n" +
				"hostssl all all 127.0.0.1/32 cert\n" +
				"hostnossl all all 127.0.0.1/32 reject\n"
			return os.WriteFile(filepath.Join(dataDir, "pg_hba.conf"), []byte(hba), 0o600)
		},
	})
	return cluster, ca, client
}

// TestPostgresTLSWithClientCertificate runs the writer, `outbox migrate`,
// `outbox relay` and `outbox status` against a PostgreSQL that requires
// TLS and a client certificate, all configured by DATABASE_URL alone
// (sslmode=verify-full, sslrootcert, sslcert, sslkey): the event written
// is published. A client that does not trust the server's CA, one that
// trusts another CA, one without a client certificate and one without TLS
// are each refused, with an error that says why.
func TestPostgresTLSWithClientCertificate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster, ca, client := tlsCluster(t)
	base := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres", cluster.Port())
	good := fmt.Sprintf("%s?sslmode=verify-full&sslrootcert=%s&sslcert=%s&sslkey=%s", base, ca.CertFile, client.CertFile, client.KeyFile)
	schema := outboxtest.UniqueName(t, "tls")
	env := func(dsn string) []string {
		return append(os.Environ(), "DATABASE_URL="+dsn, "OUTBOX_SCHEMA="+schema, "OUTBOX_FAILPOINTS=")
	}

	if out, err := runWithEnv(t, env(good), "migrate"); err != nil {
		t.Fatalf("outbox migrate over TLS: %v\n%s", err, out)
	}
	pool, err := pgxpool.New(ctx, good)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var ssl bool
	if err := pool.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl); err != nil || !ssl {
		t.Fatalf("the writer's session is not encrypted (ssl=%t, %v)", ssl, err)
	}
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "o1", Type: "OrderCreated", Payload: []byte(`{}`)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	nats := natstest.Embedded(t)
	relay := startProcess(t, env(good), "relay", "--destination", nats.ClientURL(), "--poll-interval", "50ms")
	outboxtest.Eventually(t, 60*time.Second, "the relay publishes the event over a TLS database session", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events WHERE published_at IS NOT NULL`).Scan(&n)
		return n == 1
	})
	relay.stop(t)

	out, err := runWithEnv(t, env(good), "status", "--json")
	if err != nil {
		t.Fatalf("outbox status over TLS: %v\n%s", err, out)
	}
	var st struct {
		Pending int64 `json:"pending"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Pending != 0 {
		t.Errorf("outbox status --json over TLS: pending %d, %v:\n%s", st.Pending, err, out)
	}

	other := testcert.NewCA(t, "other")
	for name, c := range map[string]struct{ dsn, want string }{
		"system roots only": {base + fmt.Sprintf("?sslmode=verify-full&sslcert=%s&sslkey=%s", client.CertFile, client.KeyFile), "certificate signed by unknown authority"},
		"another CA":        {base + fmt.Sprintf("?sslmode=verify-full&sslrootcert=%s&sslcert=%s&sslkey=%s", other.CertFile, client.CertFile, client.KeyFile), "certificate signed by unknown authority"},
		"no client cert":    {base + "?sslmode=verify-full&sslrootcert=" + ca.CertFile, "connection requires a valid client certificate"},
		"no TLS":            {base + "?sslmode=disable", "no encryption"},
	} {
		out, err := runWithEnv(t, env(c.dsn), "status")
		if err == nil {
			t.Errorf("%s: outbox status succeeded:\n%s", name, out)
			continue
		}
		if !strings.Contains(out, c.want) || strings.Count(strings.TrimSpace(out), "\n") > 0 {
			t.Errorf("%s: outbox status failed with %q, want one line saying %q", name, out, c.want)
		}
	}
}
