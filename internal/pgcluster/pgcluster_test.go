package pgcluster

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// fakeBin makes dir/initdb (an empty executable file) and returns dir.
func fakeBin(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "initdb"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestFindBinDir checks where the server binaries are looked for, in
// order, on a fake file system: PG_BINDIR, pg_config --bindir, the Debian,
// Homebrew and PGDG layouts (newest version first), the PATH; and that
// finding none names what to install.
func TestFindBinDir(t *testing.T) {
	t.Parallel()
	noPath := func(string) (string, error) { return "", exec.ErrNotFound }
	search := func(root string, env map[string]string, pgConfig string, lookPath func(string) (string, error)) binSearch {
		return binSearch{getenv: func(k string) string { return env[k] }, root: root,
			pgConfig: func() string { return pgConfig }, lookPath: lookPath}
	}
	t.Run("order", func(t *testing.T) {
		root := t.TempDir()
		debian15 := fakeBin(t, filepath.Join(root, "usr/lib/postgresql/15/bin"))
		debian9 := fakeBin(t, filepath.Join(root, "usr/lib/postgresql/9/bin"))
		// A newer version without initdb (only the client installed).
		if err := os.MkdirAll(filepath.Join(root, "usr/lib/postgresql/17/bin"), 0o755); err != nil {
			t.Fatal(err)
		}
		brew := fakeBin(t, filepath.Join(root, "opt/homebrew/opt/postgresql@17/bin"))
		fakeBin(t, filepath.Join(root, "opt/homebrew/opt/postgresql@16/bin"))
		own := fakeBin(t, filepath.Join(root, "own"))
		cfg := fakeBin(t, filepath.Join(root, "pgconfig"))
		onPath := func(string) (string, error) { return "/usr/bin/initdb", nil }
		for _, tc := range []struct {
			name     string
			s        binSearch
			want     string
			drop     string // removed before the search
			wantNone bool
		}{
			{name: "PG_BINDIR first", s: search(root, map[string]string{"PG_BINDIR": own}, cfg, onPath), want: own},
			{name: "then pg_config", s: search(root, nil, cfg, onPath), want: cfg},
			{name: "pg_config without initdb is passed over", s: search(root, nil, filepath.Join(root, "usr/lib/postgresql/17/bin"), onPath), want: debian15},
			{name: "Debian, newest with initdb", s: search(root, nil, "", onPath), want: debian15},
			{name: "older Debian", s: search(root, nil, "", onPath), drop: debian15, want: debian9},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if tc.drop != "" {
					if err := os.Remove(filepath.Join(tc.drop, "initdb")); err != nil {
						t.Fatal(err)
					}
				}
				got, err := findBinDir(tc.s)
				if err != nil || got != tc.want {
					t.Errorf("findBinDir = %q, %v; want %q", got, err, tc.want)
				}
			})
		}
		// Without the Debian layout: Homebrew's newest.
		if err := os.RemoveAll(filepath.Join(root, "usr/lib/postgresql")); err != nil {
			t.Fatal(err)
		}
		if got, err := findBinDir(search(root, nil, "", onPath)); err != nil || got != brew {
			t.Errorf("findBinDir = %q, %v; want Homebrew's %q", got, err, brew)
		}
	})
	t.Run("PGDG then PATH", func(t *testing.T) {
		root := t.TempDir()
		pgdg := fakeBin(t, filepath.Join(root, "usr/pgsql-16/bin"))
		onPath := func(name string) (string, error) { return "/usr/bin/" + name, nil }
		if got, err := findBinDir(search(root, nil, "", onPath)); err != nil || got != pgdg {
			t.Errorf("findBinDir = %q, %v; want %q", got, err, pgdg)
		}
		if got, err := findBinDir(search(t.TempDir(), nil, "", onPath)); err != nil || got != "/usr/bin" {
			t.Errorf("findBinDir = %q, %v; want /usr/bin from the PATH", got, err)
		}
	})
	t.Run("none", func(t *testing.T) {
		for _, env := range []map[string]string{nil, {"PG_BINDIR": t.TempDir()}} {
			_, err := findBinDir(search(t.TempDir(), env, "", noPath))
			if !errors.Is(err, ErrNoBinaries) {
				t.Fatalf("PG_BINDIR %q: err %v, want ErrNoBinaries", env["PG_BINDIR"], err)
			}
			for _, hint := range []string{"apt-get install postgresql", "dnf install postgresql-server", "brew install postgresql@17",
				"docker run -d --name outbox-postgres -p 127.0.0.1:5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:17", "PG_BINDIR"} {
				if !strings.Contains(err.Error(), hint) {
					t.Errorf("the error does not say %q:\n%v", hint, err)
				}
			}
		}
	})
}

// TestKeep checks that a kept cluster is stopped, keeps its directory,
// and starts again with the command Keep returns.
func TestKeep(t *testing.T) {
	t.Parallel()
	c, err := Start(Config{Settings: map[string]string{"work_mem": "7MB"}})
	if err != nil {
		t.Fatal(err)
	}
	dir := c.Dir()
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if !strings.HasPrefix(c.DataDir(), dir) {
		t.Fatalf("data directory %s is not under %s", c.DataDir(), dir)
	}
	restart, err := c.Keep()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(c.DataDir(), "PG_VERSION")); err != nil {
		t.Fatalf("the data directory is gone: %v", err)
	}
	if _, err := os.Stat(filepath.Join(c.DataDir(), "postmaster.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the kept cluster still runs (postmaster.pid: %v)", err)
	}
	t.Logf("restart: %s", restart)
	if out, err := exec.Command("sh", "-c", restart).CombinedOutput(); err != nil {
		t.Fatalf("restart %q: %v\n%s", restart, err, out)
	}
	t.Cleanup(func() {
		if err := c.Crash(); err != nil {
			t.Errorf("stop the restarted cluster: %v", err)
		}
	})
	c.running = true // started by the command, behind the Cluster's back
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL(""))
	if err != nil {
		t.Fatalf("connect to the restarted cluster: %v", err)
	}
	defer conn.Close(ctx)
	var workMem string
	if err := conn.QueryRow(ctx, "SHOW work_mem").Scan(&workMem); err != nil {
		t.Fatal(err)
	}
	if workMem != "7MB" {
		t.Errorf("the restarted cluster lost its settings: work_mem %s", workMem)
	}
}
