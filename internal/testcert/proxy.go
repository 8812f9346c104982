package testcert

import (
	"crypto/tls"
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy listens on 127.0.0.1 with TLS (config's certificate and client
// verification), and pipes every connection that completes the handshake
// to target in plain TCP: TLS in front of a server that has none (the
// machine's RabbitMQ, for one). It returns the address to dial; it stops
// when the test ends.
func Proxy(t testing.TB, config *tls.Config, target string) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", config)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				if err := c.(*tls.Conn).Handshake(); err != nil {
					return // the client is refused
				}
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				track(up)
				defer up.Close()
				done := make(chan struct{})
				go func() { _, _ = io.Copy(up, c); _ = up.Close(); close(done) }()
				_, _ = io.Copy(c, up)
				_ = c.Close()
				<-done
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// ServerConfig is a TLS server configuration with pair as its certificate
// that requires clients to present a certificate ca signed.
func (ca *CA) ServerConfig(t testing.TB, pair Pair) *tls.Config {
	t.Helper()
	return &tls.Config{
		Certificates: []tls.Certificate{pair.TLS(t)},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca.Pool,
		MinVersion:   tls.VersionTLS12,
	}
}
