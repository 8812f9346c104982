// Package rabbittest holds helpers for tests that publish to RabbitMQ: the
// address of the real broker of the development machine (and CI), and a
// RabbitMQ node of a test's own, on free ports with its own data directory,
// that the test can stop and start again (a broker restart).
package rabbittest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// URL is the shared broker's URL: RABBITMQ_URL, or
// amqp://guest:guest@127.0.0.1:5672/.
func URL() string {
	if u := os.Getenv("RABBITMQ_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// Conn connects to url and closes the connection when the test ends. It
// fails the test if the broker is not reachable.
func Conn(t testing.TB, url string) *amqp.Connection {
	t.Helper()
	c, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("RabbitMQ is not reachable at %s (start it, or set RABBITMQ_URL): %v", redacted(url), err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// UniqueName returns prefix with a random suffix: exchange and queue names
// no other test uses.
func UniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

func redacted(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// Server is the RabbitMQ server the tests start their own nodes with.
const Server = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// Node is a RabbitMQ node of one test: its own node name, AMQP and
// distribution ports and data directory, so that stopping it never touches
// the shared broker. It keeps its ports and data across Stop and Start.
type Node struct {
	t        testing.TB
	dir      string
	name     string
	port     int
	distPort int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  *bytes.Buffer
}

// Start starts a node and waits until it accepts AMQP connections; it is
// stopped when the test ends. A first start takes 10 to 20 seconds (the
// node creates its database); a restart on the same data somewhat less.
func Start(t testing.TB) *Node {
	t.Helper()
	if _, err := os.Stat(Server); err != nil {
		t.Fatalf("no RabbitMQ server to start a node of the test's own: %v", err)
	}
	n := &Node{t: t, dir: t.TempDir(), name: UniqueName("outboxtest") + "@localhost", port: freePort(t), distPort: freePort(t)}
	conf := fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\nloopback_users = none\n", n.port)
	for name, body := range map[string]string{"rabbitmq.conf": conf, "enabled_plugins": "[].\n", "rabbitmq-env.conf": ""} {
		if err := os.WriteFile(filepath.Join(n.dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(n.Stop)
	n.Start()
	return n
}

// URL is the node's AMQP URL (guest:guest, default vhost).
func (n *Node) URL() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.port) }

// Port is the node's AMQP port.
func (n *Node) Port() int { return n.port }

// Start starts the node again after Stop, on the same ports and data, and
// waits until it accepts AMQP connections. It does nothing if the node runs.
func (n *Node) Start() {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return
	}
	cmd := exec.Command(Server)
	cmd.Env = append(os.Environ(),
		"HOME="+n.dir, // the Erlang cookie
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(n.dir, "rabbitmq-env.conf"),
		"RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(n.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(n.distPort),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(n.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(n.dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(n.dir, "rabbitmq"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(n.dir, "enabled_plugins"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(n.dir, "advanced.config"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
	)
	n.log = new(bytes.Buffer)
	cmd.Stdout, cmd.Stderr = n.log, n.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // Stop signals the whole group
	began := time.Now()
	if err := cmd.Start(); err != nil {
		n.t.Fatalf("start RabbitMQ node: %v", err)
	}
	n.cmd, n.done = cmd, make(chan struct{})
	done := n.done
	go func() { _ = cmd.Wait(); close(done) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := amqp.DialConfig(n.URL(), amqp.Config{Dial: amqp.DefaultDial(time.Second)})
		if err == nil {
			_ = c.Close()
			n.t.Logf("RabbitMQ node %s up on port %d after %s", n.name, n.port, time.Since(began).Round(time.Millisecond))
			return
		}
		select {
		case <-done:
			n.t.Fatalf("RabbitMQ node exited while starting:\n%s", n.log)
		case <-time.After(100 * time.Millisecond): // polls the port: the node signals nothing else
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("RabbitMQ node not up after 60s: %v\n%s", err, n.log)
		}
	}
}

// Stop stops the node (SIGTERM to its process group, then SIGKILL if it
// has not exited within 30 seconds) and waits until it has exited.
func (n *Node) Stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	began := time.Now()
	pgid := n.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-n.done
	}
	// The shell script waits for the VM; stragglers of the group go too.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	n.cmd = nil
	n.t.Logf("RabbitMQ node %s stopped after %s", n.name, time.Since(began).Round(time.Millisecond))
}

// Ctl runs rabbitmqctl against the node (for instance
// "set_vm_memory_high_watermark", "0" to raise a memory alarm) and returns
// its output; it fails the test if the command fails.
func (n *Node) Ctl(args ...string) string {
	n.t.Helper()
	cmd := exec.Command(filepath.Join(filepath.Dir(Server), "rabbitmqctl"), append([]string{"-n", n.name}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+n.dir, "RABBITMQ_CONF_ENV_FILE="+filepath.Join(n.dir, "rabbitmq-env.conf"), "ERL_EPMD_ADDRESS=127.0.0.1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		n.t.Fatalf("rabbitmqctl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
