package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"github.com/pgoutbox/outbox/outboxnats"
)

// NATSServerPath returns the nats-server executable to run as the broker:
// the one on PATH, else /usr/sbin/nats-server, else "" (use an embedded
// server).
func NATSServerPath() string {
	if p, err := exec.LookPath("nats-server"); err == nil {
		return p
	}
	if p, err := exec.LookPath("/usr/sbin/nats-server"); err == nil {
		return p
	}
	return ""
}

// Broker is a NATS server with JetStream of the harness's own, which it can
// stop and start again on the same port and storage directory: a
// nats-server process when a binary is given, else a server embedded in
// this process.
type Broker struct {
	binary  string
	dir     string
	port    int
	monitor int // HTTP monitoring port, stable across restarts like port
	sink    Sink

	mu   sync.Mutex
	proc *Process
	emb  *outboxnats.Embedded
	runs int
}

// NewBroker prepares a broker storing in dir on a free port; binary is the
// nats-server executable ("" for an embedded server). Start starts it.
func NewBroker(binary, dir string, sink Sink) (*Broker, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	monitor, err := FreePort()
	if err != nil {
		return nil, err
	}
	return &Broker{binary: binary, dir: dir, port: port, monitor: monitor, sink: sink}, nil
}

// URL is the client URL, stable across restarts.
func (b *Broker) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(b.port) }

// MonitorURL is the server's HTTP monitoring endpoint, stable across
// restarts: a relay given it as monitor_url sees how the server syncs.
func (b *Broker) MonitorURL() string { return "http://127.0.0.1:" + strconv.Itoa(b.monitor) }

// Kind says what the broker is: the nats-server path or "embedded".
func (b *Broker) Kind() string {
	if b.binary == "" {
		return "embedded"
	}
	return b.binary
}

// Running reports whether the broker is up (as far as the harness knows).
func (b *Broker) Running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.emb != nil || (b.proc != nil && !b.proc.Exited())
}

// Start starts the broker and returns once it accepts connections.
func (b *Broker) Start(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.emb != nil || (b.proc != nil && !b.proc.Exited()) {
		return nil
	}
	b.runs++
	if b.binary == "" {
		// Every write fsynced before its acknowledgement (the default of
		// StartEmbedded): what the relay's check wants to see.
		e, err := outboxnats.StartEmbeddedWith(outboxnats.EmbeddedConfig{Dir: b.dir, Port: b.port, MonitorPort: b.monitor})
		if err != nil {
			return err
		}
		b.emb = e
		return nil
	}
	p, err := StartProcess(ProcessSpec{
		Name: "nats-server",
		Path: b.binary,
		Args: []string{"-a", "127.0.0.1", "-p", strconv.Itoa(b.port), "-m", strconv.Itoa(b.monitor), "-js", "-sd", b.dir},
	}, b.sink)
	if err != nil {
		return err
	}
	b.proc = p
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(b.port), time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if p.Exited() {
			return fmt.Errorf("nats-server on port %d ended at start: %v", b.port, p.Err())
		}
		select {
		case <-ctx.Done():
			p.Kill()
			return fmt.Errorf("nats-server on port %d did not start: %w", b.port, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop shuts the broker down cleanly (SIGTERM for a process), so that every
// acknowledged message is on disk. A JetStream server acknowledges a
// message once it is in its file store, which a SIGKILL can lose: the
// harness restarts the broker cleanly and kills only the outbox's own
// processes.
func (b *Broker) Stop() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.emb != nil {
		b.emb.Shutdown()
		b.emb = nil
		return nil
	}
	if b.proc == nil || b.proc.Exited() {
		return nil
	}
	// nats-server exits with status 1 after a SIGTERM; only a server that
	// had to be killed is an error.
	err := b.proc.Stop(30 * time.Second)
	if errors.As(err, new(*exec.ExitError)) {
		err = nil
	}
	return err
}

// Restarts is how many times the broker was started after its first start.
func (b *Broker) Restarts() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return max(b.runs-1, 0)
}
