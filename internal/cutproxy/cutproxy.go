// Package cutproxy is a TCP proxy for tests that loses a connection the way
// a network or a failover does: at a moment the test picks, after the
// server has answered but before the client has read the answer. It sits
// between a client and the real PostgreSQL server; nothing is simulated but
// the cut.
package cutproxy

import (
	"bytes"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy forwards connections from its address to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	marker []byte // cut the first server reply containing it (nil: none)
	cuts   atomic.Int64
	conns  map[net.Conn]struct{}
}

// New starts a proxy on a free loopback port in front of target
// ("host:port") and stops it when the test ends.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's "host:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// CutReplyContaining arms the proxy: the next chunk the server sends that
// contains marker (for PostgreSQL, e.g. the command tag "UPDATE 3\x00" of a
// CommandComplete message, which the server sends together with the
// ReadyForQuery that follows its commit) is dropped and that connection is
// closed on both sides. The server has executed and committed the
// statement; the client learns only that its connection was lost.
func (p *Proxy) CutReplyContaining(marker []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker = append([]byte(nil), marker...)
}

// Cuts counts the replies cut so far.
func (p *Proxy) Cuts() int64 { return p.cuts.Load() }

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		go func() { _, _ = io.Copy(s, c); _ = s.Close(); _ = c.Close() }()
		go p.replies(s, c)
	}
}

// replies forwards the server's bytes to the client, cutting when armed.
func (p *Proxy) replies(s, c net.Conn) {
	defer func() { _ = s.Close(); _ = c.Close() }()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			p.mu.Lock()
			cut := p.marker != nil && bytes.Contains(buf[:n], p.marker)
			if cut {
				p.marker = nil
			}
			p.mu.Unlock()
			if cut {
				p.cuts.Add(1)
				return
			}
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}
