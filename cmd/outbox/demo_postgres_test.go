package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/pgcluster"
	"github.com/pgoutbox/outbox/outboxcdc"
)

// deadPort returns a port of 127.0.0.1 where nothing listens (one that was
// free a moment ago).
func deadPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

// demoEnv is the environment for a demo process: this one's without
// DATABASE_URL and failpoints, plus extra.
func demoEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "DATABASE_URL" && k != "OUTBOX_FAILPOINTS" && k != demoDefaultURLEnv {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

var privateLineRE = regexp.MustCompile(`(?m)^  private PostgreSQL cluster on 127\.0\.0\.1:\d+, data directory (\S+) \(server binaries in \S+\): (.*); removed at the end unless --keep$`)

// demoProcess runs the demo binary with env and args; while it runs, it
// reads the private cluster's line and its postmaster's pid. It returns
// stdout, stderr, the data directory and the pid (0 when no private
// cluster was started), and the exit error.
func demoProcess(t *testing.T, env []string, args ...string) (stdout, stderr, dataDir string, postmaster int, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, outboxBinary(t), append([]string{"demo"}, args...)...)
	cmd.Env = env
	var errBuf bytes.Buffer
	cmd.Stderr = &errBuf
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	sc := bufio.NewScanner(io.TeeReader(pipe, &out))
	for sc.Scan() {
		m := privateLineRE.FindStringSubmatch(sc.Text())
		if m == nil || dataDir != "" {
			continue
		}
		dataDir = m[1]
		// The cluster runs while the line is on the screen: its
		// postmaster's pid is the first line of postmaster.pid.
		b, rerr := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
		if rerr != nil {
			t.Errorf("the private cluster announced does not run: %v", rerr)
			continue
		}
		first, _, _ := strings.Cut(string(b), "\n")
		if postmaster, rerr = strconv.Atoi(strings.TrimSpace(first)); rerr != nil {
			t.Errorf("postmaster.pid: %v", rerr)
		}
	}
	_, _ = io.Copy(io.Discard, pipe)
	err = cmd.Wait()
	t.Logf("demo %v: %v\nstdout:\n%s\nstderr:\n%s", args, err, out.String(), errBuf.String())
	return out.String(), errBuf.String(), dataDir, postmaster, err
}

// noProcessesOf waits until no process of a cluster is left: pid (its
// postmaster), its children, or one whose command line names dir. A
// postmaster can still be exiting for a moment after pg_ctl saw its pid
// file go; one that stays is what the test is about.
func noProcessesOf(t *testing.T, pid int, dir string) {
	t.Helper()
	var left []string
	outboxtest.Eventually(t, 15*time.Second, "processes of the cluster still running", func() bool {
		left = processesOf(t, pid, dir)
		return len(left) == 0
	})
	if len(left) > 0 {
		t.Errorf("the cluster's processes still run:\n%s", strings.Join(left, "\n"))
	}
}

// processesOf lists the live (not zombie) processes that are pid, its
// children, or whose command line names dir.
func processesOf(t *testing.T, pid int, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue // gone meanwhile
		}
		cmd := strings.TrimSpace(string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
		status, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if regexp.MustCompile(`(?m)^State:\s+[ZX]`).Match(status) {
			continue // exited, waiting to be reaped
		}
		ppid := 0
		if m := regexp.MustCompile(`(?m)^PPid:\s+(\d+)`).FindSubmatch(status); m != nil {
			ppid, _ = strconv.Atoi(string(m[1]))
		}
		if p == pid || (pid != 0 && ppid == pid) || strings.Contains(cmd, dir) {
			left = append(left, fmt.Sprintf("pid %d (parent %d): %s", p, ppid, cmd))
		}
	}
	return left
}

// TestDemoPrivateClusterWhenNothingAnswers runs the demo binary as a
// newcomer without a server would: DATABASE_URL unset and nothing on the
// default address (moved, for the test, to a port where nothing listens).
// It starts a private cluster, says so with its data directory, passes its
// checks, and leaves neither a process nor the directory behind. With
// --postgres private --keep, DATABASE_URL is ignored and the cluster is
// stopped and kept.
func TestDemoPrivateClusterWhenNothingAnswers(t *testing.T) {
	t.Parallel() // the demo runs as processes of their own, with their environment
	dead := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", deadPort(t))
	out, _, dataDir, pid, err := demoProcess(t, demoEnv(demoDefaultURLEnv+"="+dead), "--orders", "30")
	if err != nil {
		t.Fatalf("demo: %v", err)
	}
	m := privateLineRE.FindStringSubmatch(out)
	if m == nil || dataDir == "" {
		t.Fatal("the demo did not say it started a private cluster, with its data directory")
	}
	if want := "nothing answers at " + dead + " and DATABASE_URL is not set"; m[2] != want {
		t.Errorf("the demo says why %q, want %q", m[2], want)
	}
	if !strings.Contains(out, "demo passed: all invariants hold") {
		t.Error("the demo did not pass its checks")
	}
	if pid == 0 {
		t.Fatal("no postmaster pid was read while the cluster ran")
	}
	dir := filepath.Dir(dataDir)
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the private cluster's directory %s is still there (%v)", dir, err)
	}
	noProcessesOf(t, pid, dir)

	t.Run("private keep", func(t *testing.T) {
		out, _, dataDir, pid, err := demoProcess(t, demoEnv("DATABASE_URL="+outboxtest.DatabaseURL()),
			"--orders", "10", "--postgres", "private", "--keep", "--destination", "webhook")
		if dataDir != "" {
			t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(dataDir)) })
		}
		if err != nil {
			t.Fatalf("demo: %v", err)
		}
		if m := privateLineRE.FindStringSubmatch(out); m == nil || m[2] != "--postgres private" {
			t.Fatalf("the demo did not start a private cluster for --postgres private (%q)", m)
		}
		if _, err := os.Stat(filepath.Join(dataDir, "PG_VERSION")); err != nil {
			t.Errorf("--keep did not keep the data directory: %v", err)
		}
		if !strings.Contains(out, "kept the private cluster (stopped) in "+filepath.Dir(dataDir)+"; start it again with:") {
			t.Error("the demo did not say where the kept cluster is and how to start it")
		}
		noProcessesOf(t, pid, filepath.Dir(dataDir))
	})
}

// silentServer accepts connections and never answers: a server that is
// there but does not speak.
func silentServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	return l.Addr().String()
}

// TestDemoDatabaseURLDoesNotAnswer checks that a DATABASE_URL whose server
// does not answer fails the demo before anything starts, in one line that
// names the URL without its password, at once when nothing listens (every
// destination, both modes). TestDemoDatabaseURLNeverAnswers has the server
// that listens but never answers.
func TestDemoDatabaseURLDoesNotAnswer(t *testing.T) {
	port := deadPort(t)
	url := fmt.Sprintf("postgres://postgres:s3cret@127.0.0.1:%d/postgres?sslmode=disable", port)
	shown := fmt.Sprintf("PostgreSQL at postgres://postgres:xxxxx@127.0.0.1:%d/postgres?sslmode=disable (DATABASE_URL) does not answer: ", port)
	t.Setenv("DATABASE_URL", url)
	for _, dest := range []string{"nats", "kafka", "amqp", "webhook"} {
		for _, mode := range []string{modePolling, modeCDC} {
			var out bytes.Buffer
			err := demo(context.Background(), []string{"--destination", dest, "--mode", mode}, &out, &out)
			if err == nil || !strings.HasPrefix(err.Error(), shown) || strings.Contains(err.Error()+out.String(), "s3cret") ||
				strings.Contains(err.Error(), "\n") {
				t.Errorf("--destination %s --mode %s: %v; want one line starting %q, without the password", dest, mode, err, shown)
			}
			if strings.Contains(out.String(), "private PostgreSQL cluster") {
				t.Errorf("--destination %s --mode %s: started a private cluster although DATABASE_URL is set", dest, mode)
			}
		}
	}
}

// TestDemoDatabaseURLNeverAnswers: a DATABASE_URL whose server listens but
// never answers fails the demo binary after the demo's connect timeout,
// with exit status 1 and one line that names the URL without its password.
// Parallel (unlike TestDemoDatabaseURLDoesNotAnswer, which sets the
// environment of this process): the binary gets its environment of its own,
// and the package's serial tests run while TestMain builds it.
func TestDemoDatabaseURLNeverAnswers(t *testing.T) {
	t.Parallel()
	addr := silentServer(t)
	url := "postgres://postgres:s3cret@" + addr + "/postgres?sslmode=disable"
	outboxBinary(t) // built before the clock starts
	start := time.Now()
	out, stderr, _, _, err := demoProcess(t, demoEnv("DATABASE_URL="+url))
	elapsed := time.Since(start)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("demo: %v, want exit status 1", err)
	}
	want := "outbox demo: PostgreSQL at postgres://postgres:xxxxx@" + addr + "/postgres?sslmode=disable (DATABASE_URL) does not answer: "
	if !strings.HasPrefix(stderr, want) || strings.Count(stderr, "\n") != 1 || strings.Contains(stderr+out, "s3cret") {
		t.Errorf("stderr %q: want one line starting %q, without the password", stderr, want)
	}
	// Without a connect timeout, a server that never answers holds the
	// demo until the test's own deadline; the bound is the timeout plus
	// a process start on a loaded machine, not a speed goal.
	if elapsed > demoConnectTimeout+25*time.Second {
		t.Errorf("the demo gave up after %s; its connect timeout is %s", elapsed, demoConnectTimeout)
	}
}

// TestDemoPostgresErrors checks the demo's other PostgreSQL errors: no
// server binaries for a private cluster (the error says what to install),
// a server without wal_level=logical for --mode cdc, a bad --postgres.
func TestDemoPostgresErrors(t *testing.T) {
	t.Setenv("PG_BINDIR", t.TempDir())
	var out bytes.Buffer
	err := demo(context.Background(), []string{"--postgres", "private"}, &out, &out)
	if !errors.Is(err, pgcluster.ErrNoBinaries) {
		t.Fatalf("no binaries: %v, want pgcluster.ErrNoBinaries", err)
	}
	for _, hint := range []string{"apt-get install postgresql", "dnf install postgresql-server", "brew install postgresql@17", "docker run"} {
		if !strings.Contains(err.Error(), hint) {
			t.Errorf("no binaries: the error does not say %q: %v", hint, err)
		}
	}
	t.Setenv("PG_BINDIR", "")

	// The shared server has wal_level=replica.
	err = demo(context.Background(), []string{"--database-url", outboxtest.DatabaseURL(), "--mode", "cdc"}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "(--database-url) has wal_level=replica: --mode cdc needs wal_level=logical there") ||
		!strings.Contains(err.Error(), "--postgres private") {
		t.Errorf("cdc on a server without wal_level=logical: %v", err)
	}
	// A server that answers but refuses the role is not said not to answer.
	u, err := url.Parse(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("no_such_role", "s3cret")
	err = demo(context.Background(), []string{"--database-url", u.String()}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "(--database-url) refuses the demo: ") || strings.Contains(err.Error(), "s3cret") ||
		!strings.Contains(err.Error(), "point --database-url at a role and database it accepts") {
		t.Errorf("a role the server refuses: %v", err)
	}
	if err := demo(context.Background(), []string{"--postgres", "docker"}, &out, &out); err == nil {
		t.Error("--postgres docker: no error")
	}
}

// TestDemoCDCOnDatabaseURL runs --mode cdc on the server --database-url
// names (a cluster of the test's own with wal_level=logical): the demo
// passes, and removes its slot, publication and schema from that server.
// Then, on the same cluster, --mode cdc --keep twice: each run's
// replication slot and publication have names of their own, so the second
// run does not collide with what the first kept (TestDemoCDCKeepTwice,
// with a cluster of its own, until 7 December 2026).
func TestDemoCDCOnDatabaseURL(t *testing.T) {
	c := outboxtest.PrivateCluster(t, pgcluster.Config{Settings: map[string]string{"wal_level": "logical", "max_replication_slots": "4", "max_wal_senders": "4"}})
	report, schema, _ := runDemoTest(t, "--database-url", c.URL(""), "--mode", "cdc", "--orders", "40")
	if strings.Contains(report, "private PostgreSQL cluster") {
		t.Error("the demo started a private cluster although --database-url is set")
	}
	if m := regexp.MustCompile(`(?m)^cdc\s+(\d+)\s+published from the WAL`).FindStringSubmatch(report); m == nil || m[1] == "0" {
		t.Errorf("the CDC path published nothing (%v)", m)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var slots, pubs, schemas int
	if err := conn.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1),
	(SELECT count(*) FROM pg_publication WHERE pubname = $2),
	(SELECT count(*) FROM information_schema.schemata WHERE schema_name = $3)`,
		outboxcdc.SlotName(schema, outboxcdc.GroupDefault), outboxcdc.PublicationName(schema), schema).Scan(&slots, &pubs, &schemas); err != nil {
		t.Fatal(err)
	}
	if slots+pubs+schemas != 0 {
		t.Errorf("left behind: %d slots, %d publications, %d schemas", slots, pubs, schemas)
	}

	t.Run("keep twice", func(t *testing.T) {
		var schemas []string
		for range 2 {
			_, schema, _ := runDemoTest(t, "--database-url", c.URL(""), "--mode", "cdc", "--orders", "20", "--keep", "--destination", "kafka")
			schemas = append(schemas, schema)
		}
		for _, schema := range schemas {
			var slots int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, outboxcdc.SlotName(schema, outboxcdc.GroupDefault)).Scan(&slots); err != nil {
				t.Fatal(err)
			}
			if slots != 1 {
				t.Errorf("run of schema %s: %d slots kept, want 1", schema, slots)
			}
		}
	})
}

// fakeServer speaks just enough of PostgreSQL's protocol to let a client
// in without a password and report server_version version; it returns its
// address.
func fakeServer(t *testing.T, version string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := pgproto3.NewBackend(c, c)
				msg, err := b.ReceiveStartupMessage()
				if _, ok := msg.(*pgproto3.SSLRequest); ok && err == nil {
					if _, err := c.Write([]byte("N")); err != nil {
						return
					}
					msg, err = b.ReceiveStartupMessage()
				}
				if err != nil {
					return
				}
				b.Send(&pgproto3.AuthenticationOk{})
				b.Send(&pgproto3.ParameterStatus{Name: "server_version", Value: version})
				b.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 1}})
				b.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
				if b.Flush() != nil {
					return
				}
				for {
					if m, err := b.Receive(); err != nil {
						return
					} else if _, ok := m.(*pgproto3.Terminate); ok {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}

// TestDemoDefaultAddressUnusable: with DATABASE_URL unset, the demo uses
// the server at the default address only when it is PostgreSQL 13 or
// newer and lets it in; otherwise it starts a private cluster, and the one
// line says why: nothing answers, what answers is not PostgreSQL (an HTTP
// server, one that never answers), it wants a password, or it is too old.
// A server DATABASE_URL names that is too old fails the run, saying so.
func TestDemoDefaultAddressUnusable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	hba := func(dataDir string) error {
		return os.WriteFile(filepath.Join(dataDir, "pg_hba.conf"), []byte("host all all 127.0.0.1/32 scram-sha-256\n"), 0o600)
	}
	locked := outboxtest.PrivateCluster(t, pgcluster.Config{Prepare: hba})
	httpSrv := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(httpSrv.Close)
	httpAddr := strings.TrimPrefix(httpSrv.URL, "http://")
	old := fakeServer(t, "12.4 (Debian 12.4-1)")
	pgURL := func(addr string) string { return "postgres://postgres@" + addr + "/postgres?sslmode=disable" }
	for _, tc := range []struct{ name, url, want string }{
		{"nothing answers", pgURL(fmt.Sprintf("127.0.0.1:%d", deadPort(t))), "nothing answers at "},
		{"HTTP", pgURL(httpAddr), "what answers at " + pgURL(httpAddr) + " is not PostgreSQL ("},
		{"silent", pgURL(silentServer(t)), " is not PostgreSQL ("},
		{"password", locked.URL(""), "the server at " + locked.URL("") + " wants a password ("},
		{"too old", pgURL(old), "the server at " + pgURL(old) + " is PostgreSQL 12.4 (Debian 12.4-1), older than 13"},
		{"usable", outboxtest.DatabaseURL(), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := unusable(ctx, tc.url)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) || strings.Contains(got, "\n") {
				t.Errorf("unusable = %q, want one line with %q", got, tc.want)
			}
		})
	}
	err := checkPostgres(ctx, pgURL(old), "DATABASE_URL", false)
	if err == nil || !strings.Contains(err.Error(), "(DATABASE_URL) is PostgreSQL 12.4 (Debian 12.4-1): the outbox needs PostgreSQL 13 or newer") {
		t.Errorf("checkPostgres on PostgreSQL 12: %v", err)
	}
}
