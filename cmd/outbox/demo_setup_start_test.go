package main

// Tests of how .ci/setup starts what is down, for real, on fake systems:
// the servers it starts hold nothing of it, and what fails stops the run
// with the reason.

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// readyButNATS is a Debian system where PostgreSQL and RabbitMQ answer and
// every binary is there, and NATS is installed but down; this user may
// neither install nor use sudo, so NATS is started as the user. The fake
// nats-server writes its pid to pidFile and then runs for ten minutes,
// keeping whatever descriptors it was given, as a real server does.
func readyButNATS(t *testing.T) (s *setupSystem, pidFile string) {
	t.Helper()
	s = newSetupSystem(t, debianRelease, "none")
	s.pg, s.amqp = answer(t), answer(t)
	s.prog(t, "go", "")
	s.prog(t, "chromium", "")
	s.pythonPackages(t)
	s.file(t, "usr/lib/postgresql/16/bin/initdb", "")
	s.file(t, "usr/lib/rabbitmq/bin/rabbitmq-server", "")
	pidFile = filepath.Join(t.TempDir(), "nats.pid")
	s.prog(t, "nats-server", "echo $$ > '"+pidFile+"'\nexec sleep 600")
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return s, pidFile
}

// start runs .ci/setup for real on s, its output in a pipe as CI reads it,
// and makes the port of each service listen once its start command ran
// (starts: a call's prefix to the port). It returns the output and the
// error of Wait, failing the test if setup has not returned within a
// minute.
func (s *setupSystem) start(t *testing.T, starts map[string]int) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join("..", "..", ".ci", "setup"))
	cmd.Env = append(setupEnv(), "HOME="+s.home,
		"OUTBOX_SETUP_ROOT="+s.root, "OUTBOX_SETUP_PATH="+s.bin, "OUTBOX_SETUP_PRIVILEGE="+s.privilege,
		"OUTBOX_SETUP_PG_PORT="+strconv.Itoa(s.pg), "OUTBOX_SETUP_NATS_PORT="+strconv.Itoa(s.nats),
		"OUTBOX_SETUP_AMQP_PORT="+strconv.Itoa(s.amqp))
	cmd.Env = append(cmd.Env, s.env...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	// Once setup exits, its output must close at once: a server it
	// started holding it open would hold up whoever reads it.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	finished := false
	deadline := time.Now().Add(time.Minute)
	outboxtest.Eventually(t, 2*time.Minute, "setup to return", func() bool {
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
			finished = true
			return true
		default:
			return time.Now().After(deadline)
		}
	})
	if !finished {
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("setup has not returned within a minute: it waits for a server it started\n%s", out.String())
	}
	t.Logf(".ci/setup: %v\n%s", err, out.String())
	return out.String(), err
}

// TestSetupDetachesNATS: .ci/setup starts NATS as the user in a session of
// its own with every descriptor redirected, returns once the port answers,
// and leaves the server running: with setsid, and without it (nohup).
func TestSetupDetachesNATS(t *testing.T) {
	t.Parallel()
	setsid, err := exec.LookPath("setsid")
	if err != nil {
		t.Fatalf("setsid (util-linux) is needed on this machine: %v", err)
	}
	for _, withSetsid := range []bool{true, false} {
		t.Run("setsid="+strconv.FormatBool(withSetsid), func(t *testing.T) {
			t.Parallel()
			s, pidFile := readyButNATS(t)
			if withSetsid {
				if err := os.Symlink(setsid, filepath.Join(s.bin, "setsid")); err != nil {
					t.Fatal(err)
				}
			}
			out, err := s.start(t, map[string]int{"nats-server -a 127.0.0.1": s.nats})
			if errors.Is(err, exec.ErrWaitDelay) {
				t.Errorf("setup's output stayed open after it exited: the NATS server it started holds it")
			} else if err != nil {
				t.Errorf("setup: %v", err)
			}
			if !strings.HasSuffix(out, "setup: ready\n") {
				t.Error("setup does not say it is ready")
			}
			b, rerr := os.ReadFile(pidFile)
			if rerr != nil {
				t.Fatalf("the NATS server was not started: %v", rerr)
			}
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			if err := syscall.Kill(pid, 0); err != nil {
				t.Errorf("the NATS server (pid %d) does not run after setup returned: %v", pid, err)
			}
			if withSetsid {
				if sid := sessionOf(t, pid); sid != pid {
					t.Errorf("the NATS server (pid %d) is not in a session of its own (session %d)", pid, sid)
				}
			}
		})
	}
}

// sessionOf is the session id of process pid (/proc/PID/stat, field 6).
func sessionOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		t.Fatal(err)
	}
	// The command (field 2) is in parentheses and may hold spaces.
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	sid, err := strconv.Atoi(fields[3]) // state, ppid, pgrp, session
	if err != nil {
		t.Fatal(err)
	}
	return sid
}

// TestSetupFailuresStopTheRun: a start command that fails, or a step that
// fails where nothing expects it, stops the run (exit 1, no test runs)
// with the reason: the end of the start command's log, or the failed
// command and where.
func TestSetupFailuresStopTheRun(t *testing.T) {
	t.Parallel()
	t.Run("start command fails", func(t *testing.T) {
		t.Parallel()
		s, _ := readyButNATS(t)
		s.prog(t, "nats-server", "echo 'nats-server: cannot open /var/lib/nats: Permission denied' >&2; exit 3")
		out, err := s.start(t, nil)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Errorf("setup: %v, want exit status 1", err)
		}
		if !strings.Contains(out, "  - NATS exited (status 3) before it answered") || !strings.Contains(out, "nats-server: cannot open /var/lib/nats: Permission denied") {
			t.Error("setup does not list NATS's failed start with the end of its log")
		}
	})
	t.Run("unexpected failure", func(t *testing.T) {
		t.Parallel()
		// Debian, as root, PostgreSQL installed without a cluster: setup
		// creates one, and pg_createcluster fails.
		s, _ := readyButNATS(t)
		s.privilege = "root"
		s.pg = deadPort(t)
		s.nats = answer(t)
		s.prog(t, "pg_lsclusters", "")
		s.prog(t, "pg_ctlcluster", "")
		s.prog(t, "pg_createcluster", "echo 'Error: /var/lib/postgresql/16/main is not empty' >&2; exit 1")
		out, err := s.start(t, nil)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Errorf("setup: %v, want exit status 1", err)
		}
		if !strings.Contains(out, "setup: failed (exit 1) at line ") || !strings.Contains(out, "pg_createcluster") ||
			!strings.Contains(out, "no test runs") {
			t.Error("setup does not say which command failed, and that no test runs")
		}
		if strings.Contains(out, "setup: ready") {
			t.Error("setup says it is ready after a failure")
		}
	})
}
