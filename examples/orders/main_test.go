package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox/examples/orders/ordersapi"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binary != "" {
		_ = os.RemoveAll(filepath.Dir(binary))
	}
	os.Exit(code)
}

// ordersBinary builds the orders command once per test run.
func ordersBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "orders-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "orders")
		if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// process is a running orders subcommand.
type process struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	done chan error
	mu   sync.Mutex
	logs []string
}

// start runs "orders args..." and collects its log lines.
func start(t *testing.T, args ...string) *process {
	t.Helper()
	cmd := exec.Command(ordersBinary(t), args...)
	cmd.Env = append(os.Environ(), "OUTBOX_FAILPOINTS=")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &process{t: t, name: args[0], cmd: cmd, done: make(chan error, 1)}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.logs = append(p.logs, sc.Text())
			p.mu.Unlock()
		}
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("orders %s logs:\n%s", p.name, strings.Join(p.lines(), "\n"))
		}
	})
	return p
}

func (p *process) lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.logs...)
}

// waitLog waits for a log line matching re and returns its submatches.
func (p *process) waitLog(re *regexp.Regexp) []string {
	p.t.Helper()
	var m []string
	outboxtest.Eventually(p.t, 60*time.Second, "orders "+p.name+" logs "+re.String(), func() bool {
		for _, l := range p.lines() {
			if m = re.FindStringSubmatch(l); m != nil {
				return true
			}
		}
		return false
	})
	return m
}

// stop sends SIGTERM and expects a clean exit.
func (p *process) stop() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatal(err)
	}
	select {
	case err := <-p.done:
		if err != nil {
			p.t.Fatalf("orders %s exited with %v after SIGTERM", p.name, err)
		}
	case <-time.After(30 * time.Second):
		p.t.Fatalf("orders %s did not stop within 30s of SIGTERM", p.name)
	}
}

var listening = regexp.MustCompile(`order API listening.* addr=(\S+)`)

// TestProcesses runs the API (with an in-process relay) and the inventory
// consumer as separate processes, places and cancels orders over HTTP, waits
// for the stock reservations, and stops both with SIGTERM.
func TestProcesses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	name := outboxtest.UniqueName(t, "orders")
	stream, prefix := strings.ToUpper(name), name
	nc, err := nats.Connect(outboxtest.NATSURL())
	if err != nil {
		t.Fatalf("NATS is not reachable at %s: %v", outboxtest.NATSURL(), err)
	}
	t.Cleanup(nc.Close) // after the stream is deleted (cleanups run last-in first-out)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := js.DeleteStream(context.Background(), stream); err != nil {
			t.Errorf("delete stream %s: %v", stream, err)
		}
	})

	common := []string{"--database-url", outboxtest.DatabaseURL(), "--schema", schema,
		"--destination", outboxtest.NATSURL(), "--nats-stream", stream, "--nats-subject-prefix", prefix}
	inv := start(t, append([]string{"inventory", "--ack-wait", "5s"}, common...)...)
	api := start(t, append([]string{"api", "--listen", "127.0.0.1:0", "--relay"}, common...)...)
	base := "http://" + api.waitLog(listening)[1]

	post := func(path, body string) ordersapi.Order {
		t.Helper()
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode/100 != 2 {
			t.Fatalf("POST %s: %d %s", path, resp.StatusCode, b)
		}
		var o ordersapi.Order
		if err := json.Unmarshal(b, &o); err != nil {
			t.Fatal(err)
		}
		return o
	}
	post("/orders", `{"customer_id": "c-1", "items": [{"sku": "SKU-1001", "quantity": 2}]}`)
	post("/orders", `{"customer_id": "c-2", "items": [{"sku": "SKU-1001", "quantity": 1}, {"sku": "SKU-1002", "quantity": 4}]}`)
	third := post("/orders", `{"customer_id": "c-3", "items": [{"sku": "SKU-1002", "quantity": 7}]}`)
	post("/orders/"+third.ID+"/cancel", "")

	stock := pgx.Identifier{schema, "inventory_stock"}.Sanitize()
	processed := pgx.Identifier{schema, "processed_events"}.Sanitize()
	outboxtest.Eventually(t, 30*time.Second, "stock reserved for the orders", func() bool {
		var a, b, n int64
		err := pool.QueryRow(ctx, `SELECT
	coalesce((SELECT reserved FROM `+stock+` WHERE sku = 'SKU-1001'), -1),
	coalesce((SELECT reserved FROM `+stock+` WHERE sku = 'SKU-1002'), -1),
	(SELECT count(*) FROM `+processed+`)`).Scan(&a, &b, &n)
		return err == nil && a == 3 && b == 4 && n == 4
	})
	api.stop()
	inv.stop()
	if !hasLine(inv.lines(), "inventory consumer stopped") || !hasLine(api.lines(), "order API stopped") {
		t.Fatal("a process did not log its clean stop")
	}
}

func hasLine(lines []string, s string) bool {
	for _, l := range lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"nope"}, 2, "unknown command"},
		{[]string{"api", "--no-such-flag"}, 2, "flag provided but not defined"},
		{[]string{"inventory", "--destination", ""}, 1, "no destination"},
	} {
		cmd := exec.Command(ordersBinary(t), c.args...)
		cmd.Env = append(os.Environ(), "OUTBOX_DESTINATION=")
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != c.code || !strings.Contains(string(out), c.msg) {
			t.Errorf("orders %v: %v, output %q; want exit %d and %q", c.args, err, out, c.code, c.msg)
		}
	}
}

// TestSecretsNotShown: with a password in DATABASE_URL and in the
// destination URL, neither --help (whose defaults come from the
// environment) nor the error of a command whose database is not there
// shows it.
func TestSecretsNotShown(t *testing.T) {
	t.Parallel()
	const secret = "pw-S3CRET-orders"
	env := append(os.Environ(),
		"DATABASE_URL=postgres://app:"+secret+"@127.0.0.1:1/shop?sslmode=disable",
		"OUTBOX_DESTINATION=nats://relay:"+secret+"@127.0.0.1:1")
	for _, args := range [][]string{{"api", "--help"}, {"inventory", "--help"}, {"api"}, {"inventory"}} {
		cmd := exec.Command(ordersBinary(t), args...)
		cmd.Env = env
		out, _ := cmd.CombinedOutput()
		if strings.Contains(string(out), secret) {
			t.Errorf("orders %v shows the password:\n%s", args, out)
		}
		if !strings.Contains(string(out), "127.0.0.1") && !strings.Contains(string(out), "database-url") {
			t.Errorf("orders %v says neither which database nor how to set it:\n%s", args, out)
		}
	}
}
