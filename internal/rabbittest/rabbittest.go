// Package rabbittest holds helpers for tests that publish to RabbitMQ: the
// address of the real broker of the development machine (and CI), and a
// RabbitMQ node of a test's own, on free ports with its own data directory,
// that the test can stop and start again (a broker restart).
package rabbittest

import (
	"context"
	"net/url"
	"os"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox/internal/rabbitnode"
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
	return rabbitnode.UniqueName(prefix)
}

func redacted(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// Server is the RabbitMQ server the tests start their own nodes with.
const Server = rabbitnode.ServerDefault

// Node is a RabbitMQ node of one test (a rabbitnode.Node): its own node
// name, AMQP and distribution ports and data directory, so that stopping it
// never touches the shared broker. It keeps its ports and data across Stop
// and Start.
type Node struct {
	t    testing.TB
	node *rabbitnode.Node
}

// Start starts a node and waits until it accepts AMQP connections; it is
// stopped when the test ends. A first start takes 10 to 20 seconds (the
// node creates its database); a restart on the same data somewhat less.
func Start(t testing.TB) *Node {
	t.Helper()
	rn, err := rabbitnode.New(rabbitnode.Config{Dir: t.TempDir(), Server: Server, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{t: t, node: rn}
	t.Cleanup(n.Stop)
	n.Start()
	return n
}

// URL is the node's AMQP URL (guest:guest, default vhost).
func (n *Node) URL() string { return n.node.URL() }

// Port is the node's AMQP port.
func (n *Node) Port() int { return n.node.Port() }

// Start starts the node again after Stop, on the same ports and data, and
// waits until it accepts AMQP connections. It does nothing if the node runs.
func (n *Node) Start() {
	n.t.Helper()
	if err := n.node.Start(context.Background()); err != nil {
		n.t.Fatal(err)
	}
}

// Stop stops the node (SIGTERM to its process group, then SIGKILL if it
// has not exited within 30 seconds) and waits until it has exited.
func (n *Node) Stop() { _ = n.node.Stop() }

// Ctl runs rabbitmqctl against the node (for instance
// "set_vm_memory_high_watermark", "0" to raise a memory alarm) and returns
// its output; it fails the test if the command fails.
func (n *Node) Ctl(args ...string) string {
	n.t.Helper()
	out, err := n.node.Ctl(args...)
	if err != nil {
		n.t.Fatal(err)
	}
	return out
}
