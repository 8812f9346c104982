package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
)

// pgBinDir holds initdb and pg_ctl; PG_BINDIR overrides it.
func pgBinDir() string {
	if d := os.Getenv("PG_BINDIR"); d != "" {
		return d
	}
	return "/usr/lib/postgresql/15/bin"
}

// pgCluster is a private PostgreSQL cluster of one test, in a directory of
// its own, on a free port, stopped and removed when the test ends.
type pgCluster struct {
	t    *testing.T
	dir  string
	data string
	port int
}

// asPostgres runs a PostgreSQL tool as the postgres user when the test runs
// as root (initdb and postgres refuse to run as root).
func (c *pgCluster) run(tool string, args ...string) error {
	path := filepath.Join(pgBinDir(), tool)
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %v: %v\n%s", tool, args, err, out)
	}
	return nil
}

func startPGCluster(t *testing.T) *pgCluster {
	t.Helper()
	dir, err := os.MkdirTemp("", "outbox-pg-")
	if err != nil {
		t.Fatal(err)
	}
	c := &pgCluster{t: t, dir: dir, data: filepath.Join(dir, "data")}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("tests run as root need the postgres user to run a private cluster: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.run("initdb", "-D", c.data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync", "--no-instructions"); err != nil {
		t.Fatal(err)
	}
	if c.port, err = FreePort(); err != nil {
		t.Fatal(err)
	}
	c.start()
	t.Cleanup(func() {
		if err := c.run("pg_ctl", "-D", c.data, "-m", "immediate", "-w", "stop"); err != nil {
			t.Logf("stop the private cluster: %v", err)
		}
	})
	return c
}

// URL is the cluster's connection URL.
func (c *pgCluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

func (c *pgCluster) start() {
	c.t.Helper()
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -c unix_socket_directories=%s -c max_connections=60 -c shared_buffers=32MB", c.port, c.dir)
	if err := c.run("pg_ctl", "-D", c.data, "-o", opts, "-l", filepath.Join(c.dir, "log"), "-w", "-t", "60", "start"); err != nil {
		c.t.Fatal(err)
	}
}

// crash stops the cluster the hard way (immediate shutdown: no checkpoint,
// crash recovery at the next start), dropping every connection.
func (c *pgCluster) crash() {
	c.t.Helper()
	if err := c.run("pg_ctl", "-D", c.data, "-m", "immediate", "-w", "stop"); err != nil {
		c.t.Fatal(err)
	}
}
