// Package natstest holds helpers for tests that publish to NATS JetStream:
// a connection to the real server of the development machine (and CI), an
// embedded server of the test's own, and publishers on a stream and subject
// prefix unique to the test, deleted when it ends.
package natstest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxnats"
)

// Conn connects to the real NATS server at outboxtest.NATSURL() (NATS_URL,
// default nats://127.0.0.1:4222) and closes the connection when the test
// ends. It fails the test if the server is not reachable.
func Conn(t testing.TB) *nats.Conn {
	t.Helper()
	return Connect(t, outboxtest.NATSURL())
}

// Connect connects to url with options suited to tests that stop and
// restart servers: it reconnects forever, quickly, and buffers nothing while
// disconnected. The connection is closed when the test ends.
func Connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	opts = append([]nats.Option{
		nats.Name(t.Name()),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(20 * time.Millisecond),
		nats.ReconnectJitter(0, 0),
		nats.Timeout(5 * time.Second),
	}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("NATS is not reachable at %s (start it, or set NATS_URL): %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream returns a JetStream context on nc.
func JetStream(t testing.TB, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return js
}

// Embedded starts an embedded NATS server with JetStream storing in a
// directory of the test's own, on a random port, fsyncing every write
// (outboxnats.StartEmbedded); it is shut down when the test ends.
func Embedded(t testing.TB) *outboxnats.Embedded {
	t.Helper()
	return EmbeddedWith(t, outboxnats.EmbeddedConfig{})
}

// EmbeddedWith is Embedded with cfg (a zero cfg.Dir is a directory of the
// test's own): SyncInterval: 2*time.Minute makes it a server left at
// nats-server's default sync setting.
func EmbeddedWith(t testing.TB, cfg outboxnats.EmbeddedConfig) *outboxnats.Embedded {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	e, err := outboxnats.StartEmbeddedWith(cfg)
	if err != nil {
		t.Fatalf("start embedded NATS server: %v", err)
	}
	t.Cleanup(e.Shutdown)
	return e
}

// Config returns a publisher configuration with a stream name and a subject
// prefix unique to this test.
func Config(t testing.TB) outboxnats.Config {
	return outboxnats.Config{
		Stream:        outboxtest.UniqueName(t, "s"),
		SubjectPrefix: outboxtest.UniqueName(t, "p"),
	}
}

// Publisher creates a publisher with cfg on js (a zero cfg.Stream or
// cfg.SubjectPrefix is replaced with a name unique to the test, unlike
// NewPublisher's defaults) and deletes its stream when the test ends.
func Publisher(t testing.TB, js jetstream.JetStream, cfg outboxnats.Config) *outboxnats.Publisher {
	t.Helper()
	unique := Config(t)
	if cfg.Stream == "" {
		cfg.Stream = unique.Stream
	}
	if cfg.SubjectPrefix == "" {
		cfg.SubjectPrefix = unique.SubjectPrefix
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	DeleteStreamAtCleanup(t, js, cfg.Stream)
	p, err := outboxnats.NewPublisher(ctx, js, cfg)
	if err != nil {
		t.Fatalf("outboxnats.NewPublisher(stream %s, prefix %s): %v", cfg.Stream, cfg.SubjectPrefix, err)
	}
	return p
}

// DeleteStreamAtCleanup deletes the stream when the test ends (a stream that
// does not exist is fine). A server that is gone by then is not an error.
func DeleteStreamAtCleanup(t testing.TB, js jetstream.JetStream, stream string) {
	t.Helper()
	t.Cleanup(func() {
		if !js.Conn().IsConnected() {
			t.Logf("not deleting stream %s: the NATS connection is %s", stream, js.Conn().Status())
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := js.DeleteStream(ctx, stream)
		switch {
		case err == nil, errors.Is(err, jetstream.ErrStreamNotFound):
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrConnectionClosed):
			// The test stopped the server (an embedded one) under us.
			t.Logf("not deleting stream %s: the NATS server is gone: %v", stream, err)
		default:
			t.Errorf("delete stream %s: %v", stream, err)
		}
	})
}
