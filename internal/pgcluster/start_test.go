package pgcluster

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// openDir makes a directory every user may enter (t.TempDir's are 0700,
// which the postgres user could not enter when the tests run as root).
func openDir(t *testing.T, parts ...string) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir = filepath.Join(append([]string{dir}, parts...)...)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// connect checks that the cluster answers a query.
func connect(t *testing.T, c *Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL(""))
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, c.Log())
	}
	defer conn.Close(ctx)
	if err := conn.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLongTempDir: under a TMPDIR too long for a Unix socket's path (107
// bytes), the cluster starts (its socket in a short directory of its own)
// and Close removes both directories.
func TestLongTempDir(t *testing.T) {
	long := openDir(t, strings.Repeat("d", 60), strings.Repeat("e", 60))
	t.Setenv("TMPDIR", long)
	c, err := Start(Config{})
	if err != nil {
		t.Fatalf("start under a long TMPDIR (%d bytes): %v", len(long), err)
	}
	connect(t, c)
	sock := c.sock
	if len(filepath.Join(sock, ".s.PGSQL.65535")) > maxSocketPath {
		t.Errorf("socket directory %s is too long", sock)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{c.Dir(), sock} {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there after Close (%v)", d, err)
		}
	}
}

// TestTempDirOnlyTheCallerReaches: a TMPDIR only its owner may enter (a
// 0700 directory, as under /root): the cluster starts all the same (as
// root, in a directory the server's user reaches).
func TestTempDirOnlyTheCallerReaches(t *testing.T) {
	private := t.TempDir()
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", private)
	c, err := Start(Config{})
	if err != nil {
		t.Fatalf("start under a 0700 TMPDIR: %v", err)
	}
	defer c.Close()
	connect(t, c)
}

// TestStartFailureShowsLog: when the server does not start, the error
// carries the end of its log (where PostgreSQL says why), and nothing is
// left behind.
func TestStartFailureShowsLog(t *testing.T) {
	t.Parallel()
	_, err := Start(Config{Settings: map[string]string{"no_such_setting_x": "1"}})
	if err == nil || !strings.Contains(err.Error(), `unrecognized configuration parameter "no_such_setting_x"`) {
		t.Fatalf("err %v: want the server log's reason", err)
	}
}

// TestDiskFull: initdb failing for want of space says so plainly, with
// what to do (a fake initdb fails as a full disk makes it).
func TestDiskFull(t *testing.T) {
	bin := openDir(t)
	if err := os.WriteFile(filepath.Join(bin, "initdb"), []byte(`#!/bin/sh
echo 'creating directory data ... ok'
echo 'initdb: error: could not write to file "data/base/1/1255": No space left on device' >&2
exit 1
`), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PG_BINDIR", bin)
	_, err := Start(Config{})
	if err == nil || !strings.Contains(err.Error(), "is full (no space left on device): free some space there, or set TMPDIR") {
		t.Fatalf("err %v: want a full file system named as the cause", err)
	}
}

// TestHelperCluster is not a test: run by TestLeftoversOfAKilledProcess
// in a process of its own (PGCLUSTER_HELPER=1), it starts a cluster,
// prints its directory and waits to be killed.
func TestHelperCluster(t *testing.T) {
	if os.Getenv("PGCLUSTER_HELPER") != "1" {
		return
	}
	c, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("DIR " + c.Dir() + "\n")
	time.Sleep(10 * time.Minute)
}

// TestLeftoversOfAKilledProcess: a process that started a cluster is
// killed (SIGKILL: no Close); the cluster's server outlives it. The next
// start's sweep (RemoveLeftovers) stops that server and removes its
// directory; it leaves alone the cluster of a process that runs.
func TestLeftoversOfAKilledProcess(t *testing.T) {
	t.Parallel()
	base := openDir(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperCluster$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PGCLUSTER_HELPER=1", "TMPDIR="+base)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var dir string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "DIR "); ok {
			dir = d
			break
		}
	}
	if dir == "" {
		t.Fatal("the helper did not start a cluster")
	}
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	postmaster, _ := strconv.Atoi(first)

	if got := RemoveLeftovers(base); len(got) != 0 {
		t.Fatalf("removed %v while its owner runs", got)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// Its cluster and the template the cluster was copied from.
	got := RemoveLeftovers(base)
	if len(got) != 2 || !slices.Contains(got, dir) {
		t.Fatalf("removed %v, want the killed process's %s and its template", got, dir)
	}
	for _, d := range got {
		if d != dir && !strings.HasPrefix(filepath.Base(d), templatePrefix) {
			t.Errorf("removed %s, neither the killed process's cluster nor its template", d)
		}
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there (%v)", d, err)
		}
	}
	// The postmaster may still be exiting for a moment; one that stays is
	// the leftover this is about.
	deadline := time.Now().Add(15 * time.Second)
	for syscall.Kill(postmaster, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if err := syscall.Kill(postmaster, 0); err == nil {
		t.Errorf("the killed process's postmaster (pid %d) still runs", postmaster)
		_ = syscall.Kill(postmaster, syscall.SIGKILL)
	}
}
