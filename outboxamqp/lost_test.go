package outboxamqp_test

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/outboxamqp"
)

// proxy forwards TCP connections to the shared broker. hold stops the
// broker's answers (confirmations) from reaching the client; cut closes
// every connection, as a network failure would.
type proxy struct {
	l    net.Listener
	held atomic.Bool
	sent atomic.Int64 // bytes client -> broker while held

	mu    sync.Mutex
	conns []net.Conn
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l}
	t.Cleanup(func() { l.Close(); p.cut() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, b)
			p.mu.Unlock()
			go p.pipe(b, c, true)  // client -> broker
			go p.pipe(c, b, false) // broker -> client
		}
	}()
	return p
}

func (p *proxy) pipe(dst, src net.Conn, fromClient bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if fromClient && p.held.Load() {
				p.sent.Add(int64(n))
			}
			if !fromClient && p.held.Load() {
				n = 0 // swallow the broker's answers
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				_ = dst.Close()
			}
			return
		}
	}
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.held.Store(false)
}

// TestLostConnectionIsUnavailable: when the connection is lost after a
// batch was sent but before it was confirmed, Publish fails every message
// as unavailable at once (not after ConfirmTimeout), and the next Publish
// connects again and succeeds.
func TestLostConnectionIsUnavailable(t *testing.T) {
	t.Parallel()
	px := startProxy(t, "127.0.0.1:5672")
	_, b := setup(t, rabbittest.URL(), outboxamqp.Config{}, "outbox.order")
	p, err := outboxamqp.NewPublisher(outboxamqp.Config{URL: "amqp://guest:guest@" + px.l.Addr().String() + "/",
		Exchange: b.exchange, ConfirmTimeout: 2 * time.Minute, DialTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx := testCtx(t)
	checkNil(t, p.Publish(ctx, []outbox.Message{event("o-0", 1)}))

	px.held.Store(true)
	msgs := []outbox.Message{event("o-1", 1), event("o-2", 1), event("o-3", 1)}
	result := make(chan []error, 1)
	began := time.Now()
	go func() { result <- p.Publish(ctx, msgs) }()
	for px.sent.Load() < 3*300 { // the three messages went out (each over 300 bytes of properties)
		select {
		case errs := <-result:
			t.Fatalf("Publish returned while the broker's answers were held (%d bytes sent): %v", px.sent.Load(), errs)
		case <-time.After(5 * time.Millisecond):
		}
	}
	px.cut()
	errs := <-result
	// A Publish that waits for the confirms takes ConfirmTimeout (two
	// minutes); half a minute is room for a loaded machine.
	if time.Since(began) > 30*time.Second {
		t.Errorf("Publish took %s: it waited for ConfirmTimeout instead of seeing the connection go", time.Since(began))
	}
	if len(errs) != len(msgs) {
		t.Fatalf("Publish errors %v, want one per message", errs)
	}
	for i, err := range errs {
		if !outbox.IsUnavailable(err) {
			t.Errorf("message %d: %v, want unavailable", i, err)
		}
	}
	checkNil(t, p.Publish(ctx, []outbox.Message{event("o-4", 1)}))
	if err := p.Probe(ctx); err != nil {
		t.Fatalf("Probe after reconnecting: %v", err)
	}
}
