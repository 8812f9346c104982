// Package rabbitnode runs a RabbitMQ node of its own: a rabbitmq-server
// process with its own node name, AMQP and distribution ports and data
// directory, which it can stop and start again on the same ports and data
// (a broker restart) without touching any other RabbitMQ on the machine.
// The chaos harness runs one for broker faults; internal/rabbittest wraps it
// for tests.
package rabbitnode

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ServerDefault is the rabbitmq-server script of the Debian package.
const ServerDefault = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// StartTimeoutDefault bounds a start: a first start creates the node's
// database and takes 10 to 20 seconds on a small machine.
const StartTimeoutDefault = 60 * time.Second

// Config configures a Node.
type Config struct {
	// Dir holds the node's configuration, data and logs; it must exist.
	Dir string
	// Server is the rabbitmq-server executable. Defaults to ServerDefault.
	Server string
	// Logf, if set, receives a line when the node starts or stops.
	Logf func(format string, args ...any)
}

// Node is a RabbitMQ node of its own. Its methods are safe for concurrent
// use.
type Node struct {
	cfg      Config
	name     string
	port     int
	distPort int

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	output *bytes.Buffer
	starts int
}

// New prepares a node on free ports storing in cfg.Dir; Start starts it.
func New(cfg Config) (*Node, error) {
	if cfg.Server == "" {
		cfg.Server = ServerDefault
	}
	if cfg.Dir == "" {
		return nil, errors.New("rabbitnode: no directory")
	}
	if _, err := os.Stat(cfg.Server); err != nil {
		return nil, fmt.Errorf("rabbitnode: no RabbitMQ server to start a node of its own: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	distPort, err := freePort()
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, name: UniqueName("outbox") + "@localhost", port: port, distPort: distPort}
	conf := fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\nloopback_users = none\n", n.port)
	for name, body := range map[string]string{"rabbitmq.conf": conf, "enabled_plugins": "[].\n", "rabbitmq-env.conf": ""} {
		if err := os.WriteFile(filepath.Join(cfg.Dir, name), []byte(body), 0o600); err != nil {
			return nil, fmt.Errorf("rabbitnode: %w", err)
		}
	}
	return n, nil
}

// UniqueName returns prefix with a random suffix.
func UniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// URL is the node's AMQP URL (guest:guest, default vhost), stable across
// restarts.
func (n *Node) URL() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.port) }

// Port is the node's AMQP port.
func (n *Node) Port() int { return n.port }

// Name is the Erlang node name.
func (n *Node) Name() string { return n.name }

// Restarts is how many times the node was started after its first start.
func (n *Node) Restarts() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return max(n.starts-1, 0)
}

// Start starts the node (again, after Stop, on the same ports and data) and
// returns once it accepts AMQP connections, or with an error when it exits,
// is not up within StartTimeoutDefault or ctx ends (it is stopped then). It
// does nothing if the node runs.
func (n *Node) Start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return nil
	}
	dir := n.cfg.Dir
	cmd := exec.Command(n.cfg.Server)
	cmd.Env = append(n.env(),
		"RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(n.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(n.distPort),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(dir, "advanced.config"),
	)
	n.output = new(bytes.Buffer)
	cmd.Stdout, cmd.Stderr = n.output, n.output
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // Stop signals the whole group
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("rabbitnode: start %s: %w", n.cfg.Server, err)
	}
	n.cmd, n.done = cmd, make(chan struct{})
	done := n.done
	go func() { _ = cmd.Wait(); close(done) }()
	deadline := time.NewTimer(StartTimeoutDefault)
	defer deadline.Stop()
	for {
		c, err := amqp.DialConfig(n.URL(), amqp.Config{Dial: amqp.DefaultDial(time.Second)})
		if err == nil {
			_ = c.Close()
			n.starts++
			n.logf("RabbitMQ node %s up on port %d after %s", n.name, n.port, time.Since(began).Round(time.Millisecond))
			return nil
		}
		select {
		case <-done:
			n.cmd = nil
			return fmt.Errorf("rabbitnode: node %s exited while starting:\n%s", n.name, n.output)
		case <-ctx.Done():
			n.stopLocked()
			return fmt.Errorf("rabbitnode: node %s not up: %w", n.name, ctx.Err())
		case <-deadline.C:
			n.stopLocked()
			return fmt.Errorf("rabbitnode: node %s not up after %s: %v\n%s", n.name, StartTimeoutDefault, err, n.output)
		case <-time.After(100 * time.Millisecond): // polls the port: the node signals nothing else
		}
	}
}

// Stop stops the node (SIGTERM to its process group, then SIGKILL if it has
// not exited within 30 seconds) and waits until it has exited. It does
// nothing if the node is not running.
func (n *Node) Stop() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stopLocked()
	return nil
}

func (n *Node) stopLocked() {
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
	n.logf("RabbitMQ node %s stopped after %s", n.name, time.Since(began).Round(time.Millisecond))
}

// Ctl runs rabbitmqctl against the node (for instance
// "set_vm_memory_high_watermark", "0" to raise a memory alarm) and returns
// its output.
func (n *Node) Ctl(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(filepath.Dir(n.cfg.Server), "rabbitmqctl"), append([]string{"-n", n.name}, args...)...)
	cmd.Env = n.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("rabbitmqctl %v: %w\n%s", args, err, out)
	}
	return string(out), nil
}

// env is the environment of the node's commands: HOME holds the Erlang
// cookie; epmd listens on the loopback address only.
func (n *Node) env() []string {
	return append(os.Environ(),
		"HOME="+n.cfg.Dir,
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(n.cfg.Dir, "rabbitmq-env.conf"),
		"ERL_EPMD_ADDRESS=127.0.0.1")
}

func (n *Node) logf(format string, args ...any) {
	if n.cfg.Logf != nil {
		n.cfg.Logf(format, args...)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("rabbitnode: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
