package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/pgcluster"
)

// The secrets the tests below hand to the outbox binary; none of them may
// appear in anything it prints.
const (
	dbPassword         = "pw-db-S3CRET"
	sslPassword        = "pw-ssl-S3CRET"
	kafkaPassword      = "pw-kafka-S3CRET"
	amqpPassword       = "pw-amqp-S3CRET"
	webhookSecret      = "whsec_cHctd2ViaG9vay1TM0NSRVQtcHctd2ViaG9vaw=="
	consoleTokenSecret = "pw-console-S3CRET"
	destinationPass    = "pw-dest-S3CRET"
)

// secretEnv is the environment of a run: every secret variable the
// binaries read is set.
func secretEnv(databaseURL string) []string {
	return append(os.Environ(),
		"DATABASE_URL="+databaseURL,
		"OUTBOX_DESTINATION=amqp://relay:"+destinationPass+"@127.0.0.1:1/",
		"OUTBOX_KAFKA_PASSWORD="+kafkaPassword,
		"OUTBOX_AMQP_PASSWORD="+amqpPassword,
		"OUTBOX_WEBHOOK_SECRET="+webhookSecret,
		"OUTBOX_CONSOLE_TOKEN="+consoleTokenSecret,
		"OUTBOX_FAILPOINTS=",
	)
}

// assertNoSecret fails the test when out shows any of the secrets, in any
// of the forms a URL or a log line could carry it.
func assertNoSecret(t *testing.T, what, out string) {
	t.Helper()
	for _, s := range []string{"S3CRET", "20247", webhookSecret, strings.TrimPrefix(webhookSecret, "whsec_")} {
		if strings.Contains(out, s) {
			t.Errorf("%s shows a secret (%.10s…):\n%s", what, s, out)
		}
	}
}

// runOutbox runs the outbox binary with env and args to its end (or a
// minute), and returns what it printed on stdout and stderr together.
func runWithEnv(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, outboxBinary(t), args...)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// commandsOnTheDatabase are invocations of every command that talks to the
// database, each with the flags it needs to get as far as connecting.
var commandsOnTheDatabase = [][]string{
	{"migrate"},
	{"status"},
	{"status", "--json"},
	{"quarantine", "list"},
	{"quarantine", "retry", "00000000-0000-0000-0000-000000000001"},
	{"quarantine", "skip", "00000000-0000-0000-0000-000000000001", "--reason", "r"},
	{"replay", "--aggregate-type", "order", "--aggregate-id", "o1"},
	{"cleanup", "--older-than", "7d"},
	{"inbox", "status"},
}

// TestCommandsNeverShowDatabaseSecrets runs every command of the built
// binary against a database that is not there, with a password and an
// sslpassword in DATABASE_URL (URL and key=value forms) and every secret
// variable set: each fails with one line that names the database, and
// none shows a secret; nor does --help, whose defaults come from the
// environment.
func TestCommandsNeverShowDatabaseSecrets(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	for form, dsn := range map[string]string{
		"url":       fmt.Sprintf("postgres://app:%s@127.0.0.1:%d/shop?sslmode=disable&sslpassword=%s", dbPassword, port, sslPassword),
		"keyvalue":  fmt.Sprintf("host=127.0.0.1 port=%d user=app password='%s' sslpassword=%s sslmode=disable", port, dbPassword, sslPassword),
		"malformed": fmt.Sprintf("postgres://app:%s@127.0.0.1:%d/shop?sslmode=bogus", dbPassword, port),
		// pgx ends the user part at the first '@' and takes the rest of
		// the password for the host, which it quotes in its errors.
		"unencoded-at": fmt.Sprintf("postgres://app:pw@%s@127.0.0.1:%d/shop?sslmode=disable", dbPassword, port),
		// pgx sees no user part before the '/', takes "app" for the host,
		// the password's head for the port and the rest for the database
		// name, which its connection errors quote.
		"unencoded-slash": fmt.Sprintf("postgres://app:20247/%s@127.0.0.1:%d/shop?sslmode=disable", dbPassword, port),
	} {
		env := secretEnv(dsn)
		for _, args := range commandsOnTheDatabase {
			name := form + "/" + strings.Join(args, "_")
			out, err := runWithEnv(t, env, args...)
			if err == nil {
				t.Errorf("%s: succeeded without a database:\n%s", name, out)
			}
			assertNoSecret(t, name, out)
			if !strings.Contains(out, "127.0.0.1") && !strings.Contains(out, "sslmode") && !strings.Contains(out, "unencoded '@'") && !strings.Contains(out, "unencoded '/'") {
				t.Errorf("%s: the error does not say which database or what is wrong:\n%s", name, out)
			}
			if lines := strings.Count(strings.TrimSpace(out), "\n") + 1; lines != 1 {
				t.Errorf("%s: the error is %d lines, want one:\n%s", name, lines, out)
			}
		}
	}
	env := secretEnv(fmt.Sprintf("postgres://app:%s@127.0.0.1:%d/shop?sslpassword=%s", dbPassword, port, sslPassword))
	// The demo describes its destination, then fails on it or on the
	// database.
	for _, dest := range []string{
		"nats://relay:%s@127.0.0.1:%d", "amqp://relay:%s@127.0.0.1:%d/", "kafka://relay:%s@127.0.0.1:%d?sasl=plain", "http://127.0.0.1:%[2]d/hook?token=%[1]s",
	} {
		out, err := runWithEnv(t, env, "demo", "--destination", fmt.Sprintf(dest, destinationPass, port))
		if err == nil {
			t.Errorf("demo on %s succeeded without a database:\n%s", dest, out)
		}
		assertNoSecret(t, "demo on "+dest, out)
	}
	helps := [][]string{
		{"relay", "--help"}, {"status", "--help"}, {"migrate", "--help"}, {"replay", "--help"},
		{"demo", "--help"}, {"chaos", "--help"}, {"inbox", "status", "--help"}, {"quarantine", "list", "--help"},
		{"console", "--help"}, {"cleanup", "--help"}, {"sideeffect", "parked", "--help"},
	}
	for _, args := range helps {
		out, _ := runWithEnv(t, env, args...)
		assertNoSecret(t, strings.Join(args, " "), out)
		if !strings.Contains(out, "database-url") {
			t.Errorf("%s does not describe --database-url:\n%s", strings.Join(args, " "), out)
		}
	}
	// Connection strings and destinations the old redaction let through in
	// --help, whose defaults come from the environment.
	dbs := []string{
		"POSTGRES://app:" + dbPassword + "@db/shop", "  postgres://app:" + dbPassword + "@db/shop", "PostgreSQL://app:" + dbPassword + "@db/shop",
		"postgres:/app:" + dbPassword + "@db/shop", "postgres:app:" + dbPassword + "@db/shop", "postgres://app:p@" + dbPassword + "@db/shop",
		"app:" + dbPassword + "@db/shop",
	}
	dests := []string{
		"nats://tok-" + destinationPass + "@h1:4222, nats://tok2-" + destinationPass + "@h2:4222",
		"nats://u1:" + destinationPass + "@h1:4222,u2:" + destinationPass + "@h2:4222",
		"NATS://tok-" + destinationPass + "@h1,tok2-" + destinationPass + "@h2",
		"https://hooks.slack.com/services/T0/B0/" + destinationPass,
	}
	for i, db := range dbs {
		dest := dests[i%len(dests)]
		env := append(secretEnv(db), "OUTBOX_DESTINATION="+dest)
		for _, args := range [][]string{{"relay", "--help"}, {"status", "--help"}} {
			out, _ := runWithEnv(t, env, args...)
			assertNoSecret(t, fmt.Sprintf("%s with DATABASE_URL %.12s… and destination %.12s…", strings.Join(args, " "), db, dest), out)
		}
	}
}

// TestRelayWaitingForTheDatabaseShowsNoSecret starts `outbox relay` with a
// password in DATABASE_URL and in the destination URL, the database not
// there: the relay logs that it waits for the database, again and again,
// and none of its lines shows a secret.
func TestRelayWaitingForTheDatabaseShowsNoSecret(t *testing.T) {
	t.Parallel()
	dsn := fmt.Sprintf("postgres://app:%s@127.0.0.1:%d/shop?sslmode=disable&sslpassword=%s", dbPassword, freePort(t), sslPassword)
	relay := startProcess(t, secretEnv(dsn), "relay", "--metrics-addr", "127.0.0.1:0")
	outboxtest.Eventually(t, 30*time.Second, "the relay logs its second wait for the database", func() bool {
		return strings.Count(relay.out.String(), "waiting for the database") >= 2
	})
	assertNoSecret(t, "the relay's log", relay.out.String())
}

// TestRelayUnencodedAtShowsNoSecret: a password with an unencoded '@' in
// DATABASE_URL (pgx takes what follows it for the host, and quotes it in
// every connection error) is refused at start, in one line that shows no
// part of it, before the relay logs or serves /readyz anything.
func TestRelayUnencodedAtShowsNoSecret(t *testing.T) {
	t.Parallel()
	dsn := fmt.Sprintf("postgres://app:pw@%s@127.0.0.1:%d/shop?sslmode=disable", dbPassword, freePort(t))
	relay := startProcess(t, secretEnv(dsn), "relay", "--metrics-addr", "127.0.0.1:0")
	var readyz string
	outboxtest.Eventually(t, 30*time.Second, "the relay refuses the URL or waits for the database", func() bool {
		select {
		case err := <-relay.done:
			relay.done <- err
			return true
		default:
		}
		out := relay.out.String()
		if m := regexp.MustCompile(`msg="metrics listening" addr=(\S+)`).FindStringSubmatch(out); m != nil && strings.Contains(out, "waiting for the database") {
			if resp, err := http.Get("http://" + m[1] + "/readyz"); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				readyz = string(b)
			}
			return true
		}
		return false
	})
	assertNoSecret(t, "the relay's output", relay.out.String())
	assertNoSecret(t, "/readyz", readyz)
	select {
	case err := <-relay.done:
		relay.done <- err
		if err == nil || !strings.Contains(relay.out.String(), "unencoded '@'") {
			t.Errorf("the relay exited with %v, want an error about the unencoded '@':\n%s", err, relay.out.String())
		}
	default:
		t.Errorf("the relay runs with a URL pgx misreads:\n%s", relay.out.String())
	}
}

// TestWrongDatabasePasswordIsNotShown runs the CLI against a private
// cluster that checks passwords (scram-sha-256), with a wrong password:
// the authentication failure is reported, the password is not; with the
// right one, status works and shows no secret either.
func TestWrongDatabasePasswordIsNotShown(t *testing.T) {
	t.Parallel()
	cluster := outboxtest.PrivateCluster(t, pgcluster.Config{
		Settings: map[string]string{"password_encryption": "scram-sha-256"},
		Prepare: func(dataDir string) error {
			// The postgres superuser keeps trust over the local socket (to
			// create the role); everyone over TCP needs a password.
			hba := "local all all trust\nhost all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
			return os.WriteFile(filepath.Join(dataDir, "pg_hba.conf"), []byte(hba), 0o600)
		},
	})
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, cluster.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, `CREATE ROLE app LOGIN SUPERUSER PASSWORD 'right-pw-S3CRET'`); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("127.0.0.1:%d/postgres?sslmode=disable", cluster.Port())

	wrong := secretEnv("postgres://app:" + dbPassword + "@" + base)
	for _, args := range commandsOnTheDatabase {
		out, err := runWithEnv(t, wrong, args...)
		if err == nil {
			t.Errorf("%s with a wrong password succeeded:\n%s", args, out)
		}
		if !strings.Contains(out, "password authentication failed") {
			t.Errorf("%s: the error does not say the password was refused:\n%s", args, out)
		}
		assertNoSecret(t, strings.Join(args, " "), out)
	}

	right := secretEnv("postgres://app:right-pw-S3CRET@" + base)
	if out, err := runWithEnv(t, right, "migrate"); err != nil {
		t.Fatalf("migrate with the right password: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"status"}, {"status", "--json"}, {"inbox", "status"}, {"quarantine", "list"}} {
		out, err := runWithEnv(t, right, args...)
		if err != nil {
			t.Errorf("%s with the right password: %v\n%s", args, err, out)
		}
		assertNoSecret(t, strings.Join(args, " "), out)
	}
}

// process is a run of the outbox binary in the background, killed when
// the test ends.
type process struct {
	cmd  *exec.Cmd
	out  lockedBuffer
	done chan error
}

// startProcess starts the outbox binary with env and args.
func startProcess(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(outboxBinary(t), args...), done: make(chan error, 1)}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("outbox %s:\n%s", strings.Join(args, " "), p.out.String())
		}
	})
	return p
}

// stop ends the process with SIGTERM and waits for it to exit cleanly.
func (p *process) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Errorf("outbox did not stop cleanly on SIGTERM: %v\n%s", err, p.out.String())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("outbox did not stop within 30s of SIGTERM")
	}
}

// lockedBuffer is a bytes.Buffer written concurrently while the test reads it.
type lockedBuffer = outboxtest.Buffer
