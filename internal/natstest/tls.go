package natstest

import (
	"crypto/tls"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedTLS starts an embedded NATS server with JetStream that accepts
// only TLS connections made with config (its certificate, and its client
// verification: tls.RequireAndVerifyClientCert with ClientCAs makes it
// require a client certificate), on a random port of 127.0.0.1. It returns
// the server's tls:// URL; the server is shut down when the test ends.
func EmbeddedTLS(t testing.TB, config *tls.Config) string {
	t.Helper()
	opts := &server.Options{
		ServerName: "outbox-embedded-tls",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   t.TempDir(),
		NoLog:      true,
		NoSigs:     true,
		TLS:        true,
		TLSVerify:  config.ClientAuth == tls.RequireAndVerifyClientCert,
		TLSConfig:  config,
		TLSTimeout: 5,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("embedded NATS server with TLS: %v", err)
	}
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(30 * time.Second) {
		t.Fatal("embedded NATS server with TLS did not start")
	}
	return fmt.Sprintf("tls://127.0.0.1:%d", srv.Addr().(*net.TCPAddr).Port)
}
