package destinationtest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/destinationtest"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/outboxnats"
)

// TestNATS runs the suite on JetStream: the machine's NATS server, and an
// embedded server of the test's own for the restart.
func TestNATS(t *testing.T) {
	t.Parallel()
	destinationtest.Run(t, destinationtest.Destination{
		AttributePrefix: "ce-",
		DedupKey:        true,
		Open: func(t *testing.T) destinationtest.Target {
			return natsTarget(t, natstest.JetStream(t, natstest.Conn(t)))
		},
		OpenRestartable: func(t *testing.T) destinationtest.Target {
			dir := t.TempDir()
			srv, err := outboxnats.StartEmbedded(dir, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Shutdown() })
			tg := natsTarget(t, natstest.JetStream(t, natstest.Connect(t, srv.ClientURL())))
			tg.Restart = func(t *testing.T) {
				port := srv.Port()
				srv.Shutdown()
				if srv, err = outboxnats.StartEmbedded(dir, port); err != nil {
					t.Fatalf("start the NATS server again: %v", err)
				}
			}
			return tg
		},
	})
}

func natsTarget(t *testing.T, js jetstream.JetStream) destinationtest.Target {
	cfg := natstest.Config(t)
	p := natstest.Publisher(t, js, cfg)
	return destinationtest.Target{
		Publisher: p,
		Read: func(ctx context.Context, n int) ([]destinationtest.Delivery, error) {
			return readStream(ctx, js, cfg.Stream, n)
		},
		Unreachable: func(t *testing.T) outbox.Publisher {
			srv := natstest.Embedded(t)
			nc := natstest.Connect(t, srv.ClientURL())
			p := natstest.Publisher(t, natstest.JetStream(t, nc), cfg)
			srv.Shutdown()
			for nc.IsConnected() { // the client notices the server is gone
				time.Sleep(5 * time.Millisecond)
			}
			return p
		},
		Refuse: func(m outbox.Message) outbox.Message {
			// A subject over the server's control line limit.
			m.AggregateID = strings.Repeat("é", 750)
			return m
		},
	}
}

// readStream waits until the stream holds n messages and returns all of
// them in stream order.
func readStream(ctx context.Context, js jetstream.JetStream, stream string, n int) ([]destinationtest.Delivery, error) {
	var s jetstream.Stream
	var info *jetstream.StreamInfo
	var err error
	for {
		if s, err = js.Stream(ctx, stream); err == nil {
			if info, err = s.Info(ctx); err == nil && info.State.Msgs >= uint64(n) {
				break
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	var out []destinationtest.Delivery
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		raw, err := s.GetMsg(ctx, seq)
		if err != nil {
			return out, err
		}
		m, err := outboxnats.Decode(raw.Header, raw.Data)
		if err != nil {
			return out, err
		}
		out = append(out, destinationtest.Delivery{Message: m, Attributes: natsAttributes(raw.Header), Key: raw.Header.Get(nats.MsgIdHdr)})
	}
	return out, nil
}

func natsAttributes(h nats.Header) map[string]string {
	a := map[string]string{}
	for k, v := range h {
		if len(v) > 0 {
			a[strings.ToLower(k)] = v[0]
		}
	}
	return a
}
