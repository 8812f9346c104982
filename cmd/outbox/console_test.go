package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
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
		{[]string{"OUTBOX_CONSOLE_TOKEN=sh0rtT0k"}, nil, 1, "at least 16 are needed"},
		{[]string{"OUTBOX_CONSOLE_TOKEN=abababababababababababab"}, nil, 1, "too easy to guess"},
		{[]string{"OUTBOX_CONSOLE_TOKEN="}, []string{"--listen", "0.0.0.0:0", "--read-only"}, 1, "to anyone without a login"},
		{nil, []string{"--page-size", "0"}, 2, "--page-size 0 must be between 1 and 1000"},
		{nil, []string{"--listen", "nonsense"}, 2, "--listen"},
		{nil, []string{"extra"}, 2, `unexpected argument "extra"`},
	} {
		_, stderr, code := runOutbox(t, tc.env, append([]string{"console", "--schema", schema}, tc.args...)...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("console %v: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr, tc.code, tc.want)
		}
		for _, tok := range []string{"sh0rtT0k", "abababababab"} {
			if strings.Contains(stderr, tok) && strings.Contains(strings.Join(tc.env, " "), tok) {
				t.Errorf("console %v printed the token: %q", tc.args, stderr)
			}
		}
	}
	stdout, stderr, code := runOutbox(t, nil, "console", "--help")
	if code != 0 || !strings.Contains(stdout+stderr, "OUTBOX_CONSOLE_TOKEN") || !strings.Contains(stdout+stderr, "--read-only") {
		t.Errorf("console --help: exit %d, %q", code, stdout+stderr)
	}
}

var consoleURL = regexp.MustCompile(`url=http://[^ ]*:(\d+)/`)

// consoleProcess is a running `outbox console`.
type consoleProcess struct {
	cmd  *exec.Cmd
	base string // http://127.0.0.1:<port>/
	port string
	mu   sync.Mutex
	logs strings.Builder
	done chan struct{}
}

func (p *consoleProcess) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// startConsole starts `outbox console` with env and args and waits until
// it serves.
func startConsole(t *testing.T, ctx context.Context, env []string, args ...string) *consoleProcess {
	t.Helper()
	p := &consoleProcess{cmd: exec.CommandContext(ctx, outboxBinary(t), append([]string{"console"}, args...)...), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	found := make(chan string, 1)
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.logs.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			if m := consoleURL.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		_ = p.cmd.Wait()
	})
	select {
	case p.port = <-found:
	case <-ctx.Done():
		t.Fatalf("the console did not start:\n%s", p.log())
	case <-p.done:
		t.Fatalf("the console stopped:\n%s", p.log())
	}
	p.base = "http://127.0.0.1:" + p.port + "/"
	return p
}

// stop sends SIGTERM and waits for a clean exit.
func (p *consoleProcess) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-p.done
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v\n%s", err, p.log())
	}
}

// consoleGet sends a GET with the given Host (none: the URL's) and
// returns the status, the Location header and the body; redirects are not
// followed.
func consoleGet(t *testing.T, c *http.Client, url, host string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(body)
}

func noRedirects() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// TestConsoleCommandServesAndStops runs `outbox console` with a database URL
// holding a password, a token and an unreachable destination: it serves
// without replay, the pages need a login and then render without either
// secret, a POST without a session is refused, and SIGTERM stops it
// cleanly.
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
	p := startConsole(t, ctx, []string{"DATABASE_URL=" + u.String(), "OUTBOX_CONSOLE_TOKEN=" + token, "OUTBOX_DESTINATION=nats://127.0.0.1:1"},
		"--schema", schema, "--listen", "127.0.0.1:0")
	c := noRedirects()
	if code, loc, _ := consoleGet(t, c, p.base, ""); code != http.StatusSeeOther || loc != "/login" {
		t.Fatalf("GET / without a login: %d to %q, want 303 to /login", code, loc)
	}
	form := url.Values{"name": {"alice"}, "token": {token}}
	req, _ := http.NewRequest(http.MethodPost, p.base+"login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", strings.TrimSuffix(p.base, "/"))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	for _, path := range []string{"", "quarantine", "inbox", "operations", "login"} {
		code, _, body := consoleGet(t, c, p.base+path, "")
		if code != http.StatusOK {
			t.Fatalf("GET /%s: %d\n%s", path, code, body)
		}
		if strings.Contains(body, password) || strings.Contains(body, token) {
			t.Fatalf("GET /%s renders a secret", path)
		}
	}
	req, _ = http.NewRequest(http.MethodPost, p.base+"quarantine/retry", strings.NewReader("event_id=00000000-0000-0000-0000-000000000000"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", strings.TrimSuffix(p.base, "/"))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("POST without a session: %d, want 401", resp.StatusCode)
	}
	p.stop(t)
	out := p.log()
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

// TestConsoleCommandHostsAndLogin: a console listening beyond loopback with
// a token needs a login for its pages and says so at start; it refuses a
// Host it does not serve (421) and serves the --allowed-host ones;
// --public-read serves the pages without a login.
func TestConsoleCommandHostsAndLogin(t *testing.T) {
	t.Parallel()
	_, schema := outboxtest.Schema(t)
	const token = "tok-console-hosts-5e2a9c71"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	env := []string{"OUTBOX_CONSOLE_TOKEN=" + token}
	p := startConsole(t, ctx, env, "--schema", schema, "--listen", "0.0.0.0:0", "--allowed-host", "outbox.example.com")
	c := noRedirects()
	for _, host := range []string{"", "localhost:" + p.port, "outbox.example.com", "outbox.example.com:" + p.port} {
		if code, loc, _ := consoleGet(t, c, p.base, host); code != http.StatusSeeOther || loc != "/login" {
			t.Errorf("GET / with Host %q without a login: %d to %q, want 303 to /login", host, code, loc)
		}
	}
	for _, host := range []string{"evil.example", "evil.example:" + p.port, "rebind.attacker.test:" + p.port} {
		if code, _, _ := consoleGet(t, c, p.base, host); code != http.StatusMisdirectedRequest {
			t.Errorf("GET / with Host %q: %d, want 421", host, code)
		}
	}
	if out := p.log(); !strings.Contains(out, `pages="need a login"`) || !strings.Contains(out, "outbox.example.com") || !strings.Contains(out, "listens beyond this machine") {
		t.Errorf("the start-up log does not say the pages need a login, the allowed hosts and the exposure:\n%s", out)
	}
	p.stop(t)

	pub := startConsole(t, ctx, env, "--schema", schema, "--listen", "0.0.0.0:0", "--public-read")
	if code, _, body := consoleGet(t, c, pub.base, ""); code != http.StatusOK || !strings.Contains(body, "Backlog") {
		t.Errorf("GET / with --public-read: %d, want the overview", code)
	}
	if code, _, _ := consoleGet(t, c, pub.base, "evil.example:"+pub.port); code != http.StatusMisdirectedRequest {
		t.Errorf("GET / with --public-read and a foreign Host: %d, want 421", code)
	}
	if out := pub.log(); !strings.Contains(out, "pages=\"public") {
		t.Errorf("the start-up log does not say the pages are public:\n%s", out)
	}
	pub.stop(t)
}

// TestConsoleServerTimeouts: the console's server bounds reading a request
// and idle connections; a client that sends its headers and then trickles
// (or never sends) its body is cut off.
func TestConsoleServerTimeouts(t *testing.T) {
	t.Parallel()
	srv := newConsoleServer(http.NotFoundHandler(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if srv.ReadTimeout != consoleReadTimeout || srv.ReadHeaderTimeout != consoleReadHeaderTimeout || srv.IdleTimeout != consoleIdleTimeout ||
		srv.ReadTimeout <= 0 || srv.ReadHeaderTimeout <= 0 || srv.IdleTimeout <= 0 {
		t.Fatalf("timeouts: read %s, read header %s, idle %s; want all set", srv.ReadTimeout, srv.ReadHeaderTimeout, srv.IdleTimeout)
	}
	// The same server with a short read timeout, so that the test does not
	// wait 30 s: a request whose body never comes is cut off.
	srv.ReadTimeout = 300 * time.Millisecond
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.ReadAll(r.Body) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\nname="); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 512)
	for {
		if _, err := conn.Read(buf); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("the server kept the connection of a request whose body never came")
			}
			return // closed by the server
		}
	}
}
