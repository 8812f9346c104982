package outboxnats

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Embedded is an in-process NATS server with JetStream, for tests, demos and
// single-binary setups.
type Embedded struct {
	srv         *server.Server
	dir         string
	port        int
	monitorPort int
}

// EmbeddedConfig configures StartEmbeddedWith.
type EmbeddedConfig struct {
	// Dir is where JetStream stores its streams. Required.
	Dir string
	// Port is the client port on 127.0.0.1; 0 or less picks a free one.
	Port int
	// MonitorPort is the HTTP monitoring port (/varz, /jsz) on 127.0.0.1;
	// 0 picks a free one, a negative value turns monitoring off. A relay
	// whose destination URL has monitor_url=http://127.0.0.1:<port> reads
	// the server's sync setting there (see Publisher.CheckDurability).
	MonitorPort int
	// SyncInterval is how often the server fsyncs its file streams. Zero
	// (the default) fsyncs every write before acknowledging it (the
	// server's sync_interval: always), so an acknowledged message survives
	// a power loss; a positive value fsyncs only that often, like a
	// nats-server left at its default of two minutes.
	SyncInterval time.Duration
}

// StartEmbedded starts an in-process NATS server with JetStream, storing its
// streams under dir, listening on 127.0.0.1 on the given port, or on a random
// free port if port <= 0, with HTTP monitoring on a free port. It fsyncs
// every write before acknowledging it (sync_interval: always). It returns
// once the server accepts connections. Starting a new server on the same dir
// and port after Shutdown brings back the streams and their messages (file
// storage).
func StartEmbedded(dir string, port int) (*Embedded, error) {
	return StartEmbeddedWith(EmbeddedConfig{Dir: dir, Port: port})
}

// StartEmbeddedWith starts an in-process NATS server with JetStream as cfg
// says, and returns once it accepts connections.
func StartEmbeddedWith(cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.Dir == "" {
		return nil, errors.New("outboxnats: embedded server needs a storage directory")
	}
	port := cfg.Port
	if port <= 0 {
		port = server.RANDOM_PORT
	}
	opts := &server.Options{
		ServerName: "outbox-embedded",
		Host:       "127.0.0.1",
		Port:       port,
		JetStream:  true,
		StoreDir:   cfg.Dir,
		NoLog:      true,
		NoSigs:     true,
	}
	if cfg.SyncInterval > 0 {
		opts.SyncInterval = cfg.SyncInterval
	} else {
		opts.SyncAlways = true
	}
	if cfg.MonitorPort >= 0 {
		opts.HTTPHost = "127.0.0.1"
		opts.HTTPPort = cfg.MonitorPort
		if cfg.MonitorPort == 0 {
			opts.HTTPPort = server.RANDOM_PORT
		}
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("outboxnats: embedded server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("outboxnats: embedded server did not start on 127.0.0.1:%d", max(port, 0))
	}
	e := &Embedded{srv: srv, dir: cfg.Dir}
	if addr, ok := srv.Addr().(*net.TCPAddr); ok {
		e.port = addr.Port
	}
	if addr := srv.MonitorAddr(); addr != nil {
		e.monitorPort = addr.Port
	}
	return e, nil
}

// ClientURL returns the URL clients connect to, such as
// "nats://127.0.0.1:41234".
func (e *Embedded) ClientURL() string { return fmt.Sprintf("nats://127.0.0.1:%d", e.port) }

// MonitorURL returns the server's HTTP monitoring URL, such as
// "http://127.0.0.1:41235", or "" when monitoring is off. Given as the
// destination URL's monitor_url, it lets a relay see how the server syncs.
func (e *Embedded) MonitorURL() string {
	if e.monitorPort == 0 {
		return ""
	}
	return fmt.Sprintf("http://127.0.0.1:%d", e.monitorPort)
}

// Port returns the TCP port the server listens on.
func (e *Embedded) Port() int { return e.port }

// StoreDir returns the directory the server stores its streams in.
func (e *Embedded) StoreDir() string { return e.dir }

// Shutdown stops the server, closing its client connections, and returns
// once it has stopped. Calling it again does nothing.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}
