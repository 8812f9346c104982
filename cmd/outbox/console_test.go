package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestConsoleCommandRefusesUnsafeStarts: without a token the console does
// not serve beyond loopback (unless --read-only), a short token is refused,
// and bad flags are usage errors.
func TestConsoleCommandRefusesUnsafeStarts(t *testing.T) {
	t.Parallel()
	_, schema := outboxtest.Schema(t)
	for _, tc := range []struct {
		env  []string
		args []string
		code int
		want string
	}{
		{[]string{"OUTBOX_CONSOLE_TOKEN="}, []string{"--listen", "0.0.0.0:0"}, 1, "refusing to serve the console on 0.0.0.0:0 without a token"},
		{[]string{"OUTBOX_CONSOLE_TOKEN="}, []string{"--listen", ":0"}, 1, "without a token"},
		{[]string{"OUTBOX_CONSOLE_TOKEN=short"}, nil, 1, "at least 16 are needed"},
		{nil, []string{"--page-size", "0"}, 2, "--page-size 0 must be between 1 and 1000"},
		{nil, []string{"--listen", "nonsense"}, 2, "--listen"},
		{nil, []string{"extra"}, 2, `unexpected argument "extra"`},
	} {
		_, stderr, code := runOutbox(t, tc.env, append([]string{"console", "--schema", schema}, tc.args...)...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("console %v: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr, tc.code, tc.want)
		}
		if strings.Contains(stderr, "short") && strings.Contains(strings.Join(tc.env, " "), "short") {
			t.Errorf("console %v printed the token: %q", tc.args, stderr)
		}
	}
	stdout, stderr, code := runOutbox(t, nil, "console", "--help")
	if code != 0 || !strings.Contains(stdout+stderr, "OUTBOX_CONSOLE_TOKEN") || !strings.Contains(stdout+stderr, "--read-only") {
		t.Errorf("console --help: exit %d, %q", code, stdout+stderr)
	}
}

var consoleURL = regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+/)`)

// TestConsoleCommandServesAndStops runs `outbox console` with a database URL
// holding a password, a token and an unreachable destination: it serves
// without replay, the pages render without either secret, a POST without a
// session is refused, and SIGTERM stops it cleanly.
func TestConsoleCommandServesAndStops(t *testing.T) {
	t.Parallel()
	_, schema := outboxtest.Schema(t)
	const password, token = "pw-Zq8rT1x", "tok-console-cmd-7c1e93b2a0"
	u, err := url.Parse(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), password) // the test server trusts; the password is only to be hidden
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, outboxBinary(t), "console", "--schema", schema, "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+u.String(), "OUTBOX_CONSOLE_TOKEN="+token, "OUTBOX_DESTINATION=nats://127.0.0.1:1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logs strings.Builder
	found := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			logs.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if m := consoleURL.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
	}()
	var base string
	select {
	case base = <-found:
	case <-ctx.Done():
		t.Fatalf("the console did not start:\n%s", logs.String())
	}
	for _, path := range []string{"", "quarantine", "inbox", "operations", "login"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /%s: %d\n%s", path, resp.StatusCode, body)
		}
		if strings.Contains(string(body), password) || strings.Contains(string(body), token) {
			t.Fatalf("GET /%s renders a secret", path)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, base+"quarantine/retry", strings.NewReader("event_id=00000000-0000-0000-0000-000000000000"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", strings.TrimSuffix(base, "/"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("POST without a session: %d, want 401", resp.StatusCode)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-done
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v\n%s", err, logs.String())
	}
	mu.Lock()
	defer mu.Unlock()
	out := logs.String()
	if !strings.Contains(out, "replay disabled") || !strings.Contains(out, "replay=false") {
		t.Fatalf("an unreachable destination did not just disable replay:\n%s", out)
	}
	if !strings.Contains(out, "outbox console stopped") {
		t.Fatalf("no clean stop in the log:\n%s", out)
	}
	if strings.Contains(out, password) || strings.Contains(out, token) {
		t.Fatalf("the log holds a secret:\n%s", out)
	}
}
