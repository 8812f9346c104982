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
	srv  *server.Server
	dir  string
	port int
}

// StartEmbedded starts an in-process NATS server with JetStream, storing its
// streams under dir, listening on 127.0.0.1 on the given port, or on a random
// free port if port <= 0. It returns once the server accepts connections.
// Starting a new server on the same dir and port after Shutdown brings back
// the streams and their messages (file storage).
func StartEmbedded(dir string, port int) (*Embedded, error) {
	if dir == "" {
		return nil, errors.New("outboxnats: embedded server needs a storage directory")
	}
	if port <= 0 {
		port = server.RANDOM_PORT
	}
	opts := &server.Options{
		ServerName: "outbox-embedded",
		Host:       "127.0.0.1",
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		NoLog:      true,
		NoSigs:     true,
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
	e := &Embedded{srv: srv, dir: dir}
	if addr, ok := srv.Addr().(*net.TCPAddr); ok {
		e.port = addr.Port
	}
	return e, nil
}

// ClientURL returns the URL clients connect to, such as
// "nats://127.0.0.1:41234".
func (e *Embedded) ClientURL() string { return fmt.Sprintf("nats://127.0.0.1:%d", e.port) }

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
