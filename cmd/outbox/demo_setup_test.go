package main

// Tests of .ci/setup's plan (--dry-run): what it would install and start,
// given what answers and what is installed, on fake systems (a file-system
// root, a search path of fake programs, ports where something listens or
// nothing does) and on this machine.

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// setupSystem is a fake system for .ci/setup: a root for the fixed layouts,
// a directory of fake programs (each records its calls), ports and what the
// user may do.
type setupSystem struct {
	root, bin, calls, home string
	pg, nats, amqp         int
	privilege              string
	env                    []string
}

func newSetupSystem(t *testing.T, osRelease, privilege string) *setupSystem {
	t.Helper()
	dir := t.TempDir()
	s := &setupSystem{root: filepath.Join(dir, "root"), bin: filepath.Join(dir, "bin"), calls: filepath.Join(dir, "calls"),
		home: filepath.Join(dir, "home"), pg: deadPort(t), nats: deadPort(t), amqp: deadPort(t), privilege: privilege}
	for _, d := range []string{s.root, s.bin, s.home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if osRelease != "" {
		s.file(t, "etc/os-release", osRelease)
	}
	return s
}

// file writes an executable file under the root.
func (s *setupSystem) file(t *testing.T, rel, content string) string {
	t.Helper()
	p := filepath.Join(s.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// pythonDebs are Debian's Python packages of the polyglot tests and the
// module each installs for /usr/bin/python3 (.ci/setup's py_debs).
var pythonDebs = [][2]string{{"python3-psycopg", "psycopg"}, {"python3-pika", "pika"}, {"python3-confluent-kafka", "confluent_kafka"}}

// pythonPackages lays out Debian's Python packages of the polyglot tests
// as .ci/setup looks for them.
func (s *setupSystem) pythonPackages(t *testing.T) {
	t.Helper()
	for _, d := range pythonDebs {
		s.file(t, "usr/lib/python3/dist-packages/"+d[1]+"/__init__.py", "")
	}
}

// prog makes a fake program on the search path that records its call and
// then runs body.
func (s *setupSystem) prog(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(s.bin, name)
	script := "#!/bin/sh\necho \"" + name + " $*\" >> '" + s.calls + "'\n" + body + "\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// answer makes something listen on port's address for the test's length.
func answer(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().(*net.TCPAddr).Port
}

// run runs .ci/setup with args on the fake system; it returns the output
// and the exit code, and fails the test if a program other than the
// read-only ones (pg_lsclusters, pg_config) was run.
func (s *setupSystem) run(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{filepath.Join("..", "..", ".ci", "setup")}, args...)...)
	cmd.Env = append(setupEnv(), "HOME="+s.home,
		"OUTBOX_SETUP_ROOT="+s.root, "OUTBOX_SETUP_PATH="+s.bin, "OUTBOX_SETUP_PRIVILEGE="+s.privilege,
		"OUTBOX_SETUP_PG_PORT="+strconv.Itoa(s.pg), "OUTBOX_SETUP_NATS_PORT="+strconv.Itoa(s.nats),
		"OUTBOX_SETUP_AMQP_PORT="+strconv.Itoa(s.amqp))
	cmd.Env = append(cmd.Env, s.env...)
	out, err := cmd.CombinedOutput()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	t.Logf(".ci/setup %v: exit %d\n%s", args, code, out)
	calls, _ := os.ReadFile(s.calls)
	for _, c := range strings.Split(strings.TrimSpace(string(calls)), "\n") {
		if name, _, _ := strings.Cut(c, " "); c != "" && name != "pg_lsclusters" && name != "pg_config" {
			t.Errorf("the dry run ran %q", c)
		}
	}
	return string(out), code
}

// setupEnv is this process's environment without what .ci/setup reads, and
// with the npm step off (it looks at the checkout, not at the fake system).
func setupEnv() []string {
	env := []string{"OUTBOX_SETUP_NPM=0"}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "DATABASE_URL" || k == "NATS_URL" || k == "RABBITMQ_URL" || k == "PG_BINDIR" || k == "OUTBOX_CHROMIUM" || k == "HOME":
		case strings.HasPrefix(k, "OUTBOX_SETUP_"):
		default:
			env = append(env, kv)
		}
	}
	return env
}

// lines returns the lines of out that start with prefix.
func lines(out, prefix string) []string {
	var l []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, prefix) {
			l = append(l, line)
		}
	}
	return l
}

func wantLines(t *testing.T, out, prefix string, want ...string) {
	t.Helper()
	got := lines(out, prefix)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("lines %q:\n%s\nwant:\n%s", prefix, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

const (
	debianRelease = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\n"
	ubuntuRelease = "NAME=\"Ubuntu\"\nID=ubuntu\nID_LIKE=debian\n"
	fedoraRelease = "NAME=\"Fedora Linux\"\nID=fedora\n"
)

// TestSetupPlanFreshMachine: nothing installed, nothing answers. On Debian
// as root, the plan installs the four packages and starts the three
// services; without root or sudo, and off Debian, it lists what is missing
// and how to install it, and a real run would stop (exit 1).
func TestSetupPlanFreshMachine(t *testing.T) {
	t.Parallel()
	t.Run("debian root", func(t *testing.T) {
		t.Parallel()
		s := newSetupSystem(t, debianRelease, "root")
		s.prog(t, "apt-get", "")
		s.prog(t, "go", "")
		ssd := s.prog(t, "start-stop-daemon", "")
		out, code := s.run(t, "--dry-run")
		if code != 0 {
			t.Errorf("exit %d, want 0", code)
		}
		wantLines(t, out, "setup: would install", "setup: would install: apt-get update && apt-get install -y --no-install-recommends postgresql nats-server rabbitmq-server chromium python3-psycopg python3-pika python3-confluent-kafka")
		wantLines(t, out, "setup: would start NATS", "setup: would start NATS: "+ssd+" --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p "+strconv.Itoa(s.nats)+" -js -sd /var/lib/nats-server -l /var/log/nats-server.log")
		wantLines(t, out, "setup: would start RabbitMQ", "setup: would start RabbitMQ: /usr/sbin/rabbitmq-server -detached")
		if len(lines(out, "setup: would start PostgreSQL: after the install, the cluster its package creates on port "+strconv.Itoa(s.pg))) != 1 {
			t.Error("the plan does not start PostgreSQL after installing it")
		}
		wantLines(t, out, "  - ")
	})
	for _, tc := range []struct{ name, release string }{{"ubuntu without sudo", ubuntuRelease}, {"fedora", fedoraRelease}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			privilege := "none"
			if tc.release == fedoraRelease {
				privilege = "root"
			}
			s := newSetupSystem(t, tc.release, privilege)
			if tc.release == ubuntuRelease {
				s.prog(t, "apt-get", "")
			}
			out, code := s.run(t, "--dry-run")
			if code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			wantLines(t, out, "setup: would")
			if len(lines(out, "setup: missing (a real run stops here, before any test):")) != 1 {
				t.Error("the plan does not say a real run stops")
			}
			missing := lines(out, "  - ")
			for i, want := range []string{"Go 1.26 or newer", "PostgreSQL server binaries", "NATS with JetStream", "RabbitMQ server binaries", "Chromium", "Python's psycopg", "Python's pika", "Python's confluent_kafka"} {
				if i >= len(missing) || !strings.HasPrefix(missing[i], "  - "+want) {
					t.Errorf("missing item %d is not %q: %q", i, want, missing)
				}
			}
			for _, hint := range []string{"sudo apt-get install postgresql", "sudo dnf install postgresql-server", "brew install postgresql@17",
				"sudo apt-get install nats-server", "sudo apt-get install rabbitmq-server", "sudo apt-get install chromium", "docker compose up -d --wait", "https://go.dev/dl/"} {
				if !strings.Contains(strings.Join(missing, "\n"), hint) {
					t.Errorf("the missing list does not say %q", hint)
				}
			}
			if tc.release == ubuntuRelease {
				wantLines(t, out, "setup: may not install", "setup: may not install packages (neither root nor passwordless sudo): sudo apt-get update && sudo apt-get install -y --no-install-recommends postgresql nats-server rabbitmq-server chromium python3-psycopg python3-pika python3-confluent-kafka")
			}
		})
	}
}

// installedDown is a Debian system with everything installed (a cluster
// 16/main on the PostgreSQL port) and nothing running.
func installedDown(t *testing.T, privilege string) *setupSystem {
	s := newSetupSystem(t, debianRelease, privilege)
	s.prog(t, "apt-get", "")
	s.prog(t, "go", "")
	s.prog(t, "chromium", "")
	s.pythonPackages(t)
	s.prog(t, "pg_lsclusters", "echo '16  main    "+strconv.Itoa(s.pg)+" down   postgres /var/lib/postgresql/16/main /var/log/postgresql/postgresql-16-main.log'")
	s.prog(t, "pg_ctlcluster", "")
	s.prog(t, "start-stop-daemon", "")
	s.file(t, "usr/lib/postgresql/16/bin/initdb", "")
	s.file(t, "usr/sbin/nats-server", "")
	s.file(t, "usr/sbin/rabbitmq-server", "")
	s.file(t, "usr/lib/rabbitmq/bin/rabbitmq-server", "")
	return s
}

// TestSetupPlanPythonPackage: each of the polyglot tests' Debian Python
// packages is looked for on its own: with one of them missing, the plan
// installs that one alone and the report says which is not found.
func TestSetupPlanPythonPackage(t *testing.T) {
	t.Parallel()
	for _, d := range pythonDebs {
		t.Run(d[0], func(t *testing.T) {
			t.Parallel()
			s := installedDown(t, "root")
			if err := os.RemoveAll(filepath.Join(s.root, "usr/lib/python3/dist-packages", d[1])); err != nil {
				t.Fatal(err)
			}
			out, code := s.run(t, "--dry-run")
			if code != 0 {
				t.Errorf("exit %d, want 0", code)
			}
			wantLines(t, out, "setup: would install", "setup: would install: apt-get update && apt-get install -y --no-install-recommends "+d[0])
			wantLines(t, out, "setup: python3-", func() []string {
				var want []string
				for _, o := range pythonDebs {
					where := filepath.Join(s.root, "usr/lib/python3/dist-packages", o[1], "__init__.py")
					if o == d {
						where = "not found"
					}
					want = append(want, "setup: "+o[0]+": "+where)
				}
				return want
			}()...)
		})
	}
}

// TestSetupPlanInstalledButDown: everything is installed, nothing runs.
// The plan starts the PostgreSQL cluster on the port (pg_ctlcluster), NATS
// and RabbitMQ, as root directly, with sudo through it; without either it
// starts what a user may (NATS) and lists the rest.
func TestSetupPlanInstalledButDown(t *testing.T) {
	t.Parallel()
	t.Run("root", func(t *testing.T) {
		t.Parallel()
		s := installedDown(t, "root")
		out, code := s.run(t, "--dry-run")
		if code != 0 {
			t.Errorf("exit %d, want 0", code)
		}
		wantLines(t, out, "setup: would install")
		wantLines(t, out, "setup: would start",
			"setup: would start PostgreSQL: "+filepath.Join(s.bin, "pg_ctlcluster")+" --skip-systemctl-redirect 16 main start",
			"setup: would start NATS: "+filepath.Join(s.bin, "start-stop-daemon")+" --start --oknodo --background --exec "+filepath.Join(s.root, "usr/sbin/nats-server")+
				" -- -a 127.0.0.1 -p "+strconv.Itoa(s.nats)+" -js -sd /var/lib/nats-server -l /var/log/nats-server.log",
			"setup: would start RabbitMQ: "+filepath.Join(s.root, "usr/sbin/rabbitmq-server")+" -detached")
	})
	t.Run("sudo", func(t *testing.T) {
		t.Parallel()
		s := installedDown(t, "sudo")
		out, code := s.run(t, "--dry-run")
		if code != 0 {
			t.Errorf("exit %d, want 0", code)
		}
		state := filepath.Join(s.home, ".local/state/outbox")
		wantLines(t, out, "setup: would start",
			"setup: would start PostgreSQL: sudo -n "+filepath.Join(s.bin, "pg_ctlcluster")+" --skip-systemctl-redirect 16 main start",
			"setup: would start NATS: detach "+filepath.Join(s.root, "usr/sbin/nats-server")+" -a 127.0.0.1 -p "+strconv.Itoa(s.nats)+" -js -sd "+state+"/nats -l "+state+"/nats-server.log",
			"setup: would start RabbitMQ: sudo -n "+filepath.Join(s.root, "usr/sbin/rabbitmq-server")+" -detached")
		if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the dry run made %s", state)
		}
	})
	t.Run("none", func(t *testing.T) {
		t.Parallel()
		s := installedDown(t, "none")
		out, code := s.run(t, "--dry-run")
		if code != 1 {
			t.Errorf("exit %d, want 1", code)
		}
		wantLines(t, out, "setup: would start PostgreSQL")
		wantLines(t, out, "setup: would start RabbitMQ")
		wantLines(t, out, "  - ",
			"  - PostgreSQL: cluster 16/main on port "+strconv.Itoa(s.pg)+" is down: sudo pg_ctlcluster 16 main start",
			"  - RabbitMQ is installed but does not answer on 127.0.0.1:"+strconv.Itoa(s.amqp)+": sudo rabbitmq-server -detached (or sudo systemctl start rabbitmq-server)")
		if len(lines(out, "setup: would start NATS: detach ")) != 1 {
			t.Error("the plan does not start NATS as the user")
		}
	})
	t.Run("not Debian's layout", func(t *testing.T) {
		t.Parallel()
		s := newSetupSystem(t, fedoraRelease, "root")
		s.nats, s.amqp = answer(t), answer(t)
		s.prog(t, "go", "")
		s.prog(t, "chromium", "")
		s.pythonPackages(t)
		initdb := s.prog(t, "initdb", "")
		s.file(t, "usr/lib/rabbitmq/bin/rabbitmq-server", "")
		out, code := s.run(t, "--dry-run")
		if code != 1 {
			t.Errorf("exit %d, want 1", code)
		}
		wantLines(t, out, "setup: would")
		m := lines(out, "  - ")
		if len(m) != 1 || !strings.HasPrefix(m[0], "  - PostgreSQL is installed ("+filepath.Dir(initdb)+") but nothing answers on 127.0.0.1:"+strconv.Itoa(s.pg)+
			", and this is not Debian's cluster layout (pg_lsclusters): start it as your system does") {
			t.Errorf("missing %q: want PostgreSQL, installed but down, to be started as the system does", m)
		}
	})
}

// TestSetupPlanNoCluster: Debian's layout with PostgreSQL installed and no
// cluster at all, and a user who may not create one: the plan says to
// create it with pg_createcluster on the tests' port, and how to let the
// tests in.
func TestSetupPlanNoCluster(t *testing.T) {
	t.Parallel()
	s := installedDown(t, "none")
	s.nats, s.amqp = answer(t), answer(t)
	s.prog(t, "pg_lsclusters", "")
	out, code := s.run(t, "--dry-run")
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	p := strconv.Itoa(s.pg)
	wantLines(t, out, "  - ", "  - PostgreSQL: no cluster exists (pg_lsclusters lists none): create and start one on port "+p+
		" with sudo pg_createcluster -p "+p+" 16 main --start, then let the tests in: add 'host all postgres 127.0.0.1/32 trust' at the top of /etc/postgresql/16/main/pg_hba.conf and sudo pg_ctlcluster 16 main reload; or, for the three services, docker compose up -d --wait (compose.yaml)")
}

// TestSetupPlanLeavesWhatAnswers: what answers is left alone, whatever is
// installed: with every service answering (or named by DATABASE_URL) and
// every binary there, nothing is installed or started, and no program is
// run (the fake pg_ctlcluster, nats-server, rabbitmq-server record calls).
// Then the plan on this machine, whose services the tests use: it starts
// nothing.
func TestSetupPlanLeavesWhatAnswers(t *testing.T) {
	t.Parallel()
	s := installedDown(t, "root")
	s.pg, s.nats, s.amqp = answer(t), answer(t), answer(t)
	s.prog(t, "nats-server", "")
	s.prog(t, "rabbitmq-server", "")
	out, code := s.run(t, "--dry-run")
	if code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	wantLines(t, out, "setup: would")
	wantLines(t, out, "setup: nothing to install or start", "setup: nothing to install or start")
	for _, name := range []string{"PostgreSQL", "NATS", "RabbitMQ"} {
		if !regexp.MustCompile(`(?m)^setup: ` + name + ` answers on 127\.0\.0\.1:\d+: left alone$`).MatchString(out) {
			t.Errorf("the plan does not leave %s alone", name)
		}
	}

	s = installedDown(t, "root")
	s.nats, s.amqp = answer(t), answer(t)
	s.env = []string{"DATABASE_URL=postgres://elsewhere/db"}
	out, _ = s.run(t, "--dry-run")
	wantLines(t, out, "setup: would")
	wantLines(t, out, "setup: PostgreSQL", "setup: PostgreSQL: DATABASE_URL is set: yours, not looked at", "setup: PostgreSQL server binaries: "+filepath.Join(s.root, "usr/lib/postgresql/16/bin"))

	cmd := exec.Command("bash", filepath.Join("..", "..", ".ci", "setup"), "--dry-run")
	b, err := cmd.CombinedOutput()
	t.Logf(".ci/setup --dry-run on this machine: %v\n%s", err, b)
	out = string(b)
	wantLines(t, out, "setup: would start")
	for _, name := range []string{"PostgreSQL", "NATS", "RabbitMQ"} {
		if !regexp.MustCompile(`(?m)^setup: ` + name + `(:| answers on 127\.0\.0\.1:\d+: left alone$)`).MatchString(out) {
			t.Errorf("on this machine, the plan does not leave %s alone", name)
		}
	}
	if !strings.Contains(out, "setup: dry run: nothing was done") {
		t.Error("the dry run does not say it did nothing")
	}
}

// TestSetupUsage: --help prints the usage, a wrong argument is refused.
func TestSetupUsage(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("bash", filepath.Join("..", "..", ".ci", "setup"), "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Usage: bash .ci/setup [--dry-run]") {
		t.Errorf("--help: %v\n%s", err, out)
	}
	err = exec.Command("bash", filepath.Join("..", "..", ".ci", "setup"), "--dryrun").Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Errorf("--dryrun: %v, want exit status 2", err)
	}
}

// TestSetupRealRunOnFakeSystem runs .ci/setup for real on a fresh fake
// Debian system, as root: it installs the four packages (a fake apt-get
// that lays out what the packages would: binaries and a cluster 16/main,
// down), lets the tests' user into the new cluster without a password,
// starts the cluster, NATS and RabbitMQ, and waits until each answers (the
// test listens on a port once its start command has run), then says it is
// ready.
func TestSetupRealRunOnFakeSystem(t *testing.T) {
	t.Parallel()
	s := newSetupSystem(t, debianRelease, "root")
	state := filepath.Join(s.root, "var/lib/fake-dpkg")
	rec := func(name string) string { return "#!/bin/sh\necho \"" + name + " $*\" >> '" + s.calls + "'\n" }
	s.prog(t, "apt-get", `case "$*" in *install*) ;; *) exit 0 ;; esac
r='`+s.root+`'
mkdir -p "$r/usr/lib/postgresql/16/bin" "$r/etc/postgresql/16/main" "$r/usr/sbin" "$r/usr/lib/rabbitmq/bin" '`+state+`'
touch "$r/usr/lib/postgresql/16/bin/initdb" "$r/usr/lib/rabbitmq/bin/rabbitmq-server"
for m in psycopg pika confluent_kafka; do mkdir -p "$r/usr/lib/python3/dist-packages/$m" && touch "$r/usr/lib/python3/dist-packages/$m/__init__.py"; done
chmod +x "$r/usr/lib/postgresql/16/bin/initdb" "$r/usr/lib/rabbitmq/bin/rabbitmq-server"
printf 'local all postgres peer\nhost all all 127.0.0.1/32 scram-sha-256\n' > "$r/etc/postgresql/16/main/pg_hba.conf"
echo '16 main `+strconv.Itoa(s.pg)+` down postgres /var/lib/postgresql/16/main /var/log/postgresql/postgresql-16-main.log' > '`+state+`/clusters'
printf '%s' '`+rec("nats-server")+`' > "$r/usr/sbin/nats-server"
printf '%s' '`+rec("rabbitmq-server")+`' > "$r/usr/sbin/rabbitmq-server"
printf '%s' '`+rec("chromium")+`' > '`+s.bin+`/chromium'
chmod +x "$r/usr/sbin/nats-server" "$r/usr/sbin/rabbitmq-server" '`+s.bin+`/chromium'`)
	s.prog(t, "pg_lsclusters", "cat '"+state+"/clusters' 2>/dev/null || true")
	s.prog(t, "pg_ctlcluster", "")
	s.prog(t, "start-stop-daemon", "")
	s.prog(t, "go", "")

	cmd := exec.Command("bash", filepath.Join("..", "..", ".ci", "setup"))
	cmd.Env = append(setupEnv(), "HOME="+s.home,
		"OUTBOX_SETUP_ROOT="+s.root, "OUTBOX_SETUP_PATH="+s.bin, "OUTBOX_SETUP_PRIVILEGE=root",
		"OUTBOX_SETUP_PG_PORT="+strconv.Itoa(s.pg), "OUTBOX_SETUP_NATS_PORT="+strconv.Itoa(s.nats),
		"OUTBOX_SETUP_AMQP_PORT="+strconv.Itoa(s.amqp))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// Each service "comes up" once its start command ran.
	starts := map[string]int{
		"pg_ctlcluster --skip-systemctl-redirect 16 main start":                                                   s.pg,
		"start-stop-daemon --start --oknodo --background --exec " + filepath.Join(s.root, "usr/sbin/nats-server"): s.nats,
		"rabbitmq-server -detached": s.amqp,
	}
	var err error
	outboxtest.Eventually(t, 2*time.Minute, "setup to finish", func() bool {
		calls, _ := os.ReadFile(s.calls)
		for call, port := range starts {
			if strings.Contains(string(calls), call) {
				l, lerr := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
				if lerr != nil {
					t.Fatalf("listen on %d for %q: %v", port, call, lerr)
				}
				t.Cleanup(func() { l.Close() })
				delete(starts, call)
			}
		}
		select {
		case err = <-done:
			return true
		default:
			return false
		}
	})
	t.Logf(".ci/setup: %v\n%s", err, out.String())
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if len(starts) > 0 {
		t.Errorf("not started: %v", starts)
	}
	calls, _ := os.ReadFile(s.calls)
	t.Logf("calls:\n%s", calls)
	want := []string{
		"apt-get update",
		"apt-get install -y --no-install-recommends postgresql nats-server rabbitmq-server chromium python3-psycopg python3-pika python3-confluent-kafka",
		"pg_ctlcluster --skip-systemctl-redirect 16 main start",
		"start-stop-daemon --start",
		"rabbitmq-server -detached",
	}
	at := 0
	for _, c := range strings.Split(string(calls), "\n") {
		if at < len(want) && strings.HasPrefix(c, want[at]) {
			at++
		}
	}
	if at < len(want) {
		t.Errorf("calls in order: missing %q", want[at])
	}
	hba, err := os.ReadFile(filepath.Join(s.root, "etc/postgresql/16/main/pg_hba.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if first, _, _ := strings.Cut(string(hba), "\n"); !strings.HasPrefix(first, "host all postgres 127.0.0.1/32 trust") {
		t.Errorf("the new cluster's pg_hba.conf does not let postgres in from 127.0.0.1 first:\n%s", hba)
	}
	if !strings.HasSuffix(out.String(), "setup: ready\n") {
		t.Error("setup does not say it is ready")
	}
}

// TestSetupRealRunInstallFails: when apt-get install fails, a real run
// says so in its list of what is missing and exits 1, so that no test runs.
// apt-get runs twice, whatever is missing: one update, then one install of
// every package.
func TestSetupRealRunInstallFails(t *testing.T) {
	t.Parallel()
	s := newSetupSystem(t, debianRelease, "root")
	s.prog(t, "apt-get", `case "$*" in *install*) echo 'E: Unable to locate package nats-server' >&2; exit 100 ;; esac`)
	s.prog(t, "go", "")
	cmd := exec.Command("bash", filepath.Join("..", "..", ".ci", "setup"))
	cmd.Env = append(setupEnv(), "HOME="+s.home,
		"OUTBOX_SETUP_ROOT="+s.root, "OUTBOX_SETUP_PATH="+s.bin, "OUTBOX_SETUP_PRIVILEGE=root",
		"OUTBOX_SETUP_PG_PORT="+strconv.Itoa(s.pg), "OUTBOX_SETUP_NATS_PORT="+strconv.Itoa(s.nats),
		"OUTBOX_SETUP_AMQP_PORT="+strconv.Itoa(s.amqp))
	b, err := cmd.CombinedOutput()
	out := string(b)
	t.Logf(".ci/setup: %v\n%s", err, out)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("setup: %v, want exit status 1", err)
	}
	wantLines(t, out, "  - ", "  - the packages postgresql nats-server rabbitmq-server chromium python3-psycopg python3-pika python3-confluent-kafka: apt-get install -y --no-install-recommends postgresql nats-server rabbitmq-server chromium python3-psycopg python3-pika python3-confluent-kafka failed (its output is above)")
	if !strings.Contains(out, "setup: missing, so no test runs") {
		t.Error("setup does not say no test runs")
	}
	calls, _ := os.ReadFile(s.calls)
	if got := strings.TrimSpace(string(calls)); got != "apt-get update\napt-get install -y --no-install-recommends postgresql nats-server rabbitmq-server chromium python3-psycopg python3-pika python3-confluent-kafka" {
		t.Errorf("calls:\n%s\nwant one update, then one install", got)
	}
}
