package pgcluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestBinDirParity: .ci/setup (which installs what the tests need) and
// Start look for PostgreSQL's server binaries in the same places, in the
// same order: on each fake system, setup --dry-run reports the directory
// findBinDir finds (or neither finds one).
func TestBinDirParity(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		dirs   []string // directories with an initdb, under the root
		path   bool     // initdb also on the search path
		config string   // pg_config --bindir answers this (under the root)
		bindir string   // PG_BINDIR (under the root)
	}{
		{name: "Debian newest first", dirs: []string{"usr/lib/postgresql/9/bin", "usr/lib/postgresql/15/bin", "opt/homebrew/opt/postgresql@17/bin"}, path: true},
		{name: "Homebrew Apple silicon", dirs: []string{"opt/homebrew/opt/postgresql@16/bin", "opt/homebrew/opt/postgresql@17/bin", "usr/local/opt/postgresql@18/bin"}},
		{name: "Homebrew Intel", dirs: []string{"usr/local/opt/postgresql@14/bin", "usr/local/opt/postgresql/bin"}},
		{name: "Homebrew Linux", dirs: []string{"home/linuxbrew/.linuxbrew/opt/postgresql@16/bin", "usr/pgsql-17/bin"}},
		{name: "Homebrew unversioned", dirs: []string{"opt/homebrew/opt/postgresql/bin"}},
		{name: "Postgres.app", dirs: []string{"Applications/Postgres.app/Contents/Versions/latest/bin"}, path: true},
		{name: "PGDG", dirs: []string{"usr/pgsql-9/bin", "usr/pgsql-16/bin"}},
		{name: "PATH only", path: true},
		{name: "pg_config first", dirs: []string{"usr/lib/postgresql/16/bin", "srv/pg/bin"}, config: "srv/pg/bin"},
		{name: "pg_config without initdb", dirs: []string{"usr/lib/postgresql/16/bin"}, config: "srv/none/bin"},
		{name: "PG_BINDIR first", dirs: []string{"usr/lib/postgresql/16/bin", "srv/own"}, bindir: "srv/own"},
		{name: "PG_BINDIR without initdb", dirs: []string{"usr/lib/postgresql/16/bin"}, bindir: "srv/none"},
		{name: "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			root, bin := filepath.Join(dir, "root"), filepath.Join(dir, "bin")
			for _, d := range tc.dirs {
				fakeBin(t, filepath.Join(root, d))
			}
			if err := os.MkdirAll(bin, 0o755); err != nil {
				t.Fatal(err)
			}
			if tc.path {
				fakeBin(t, bin)
			}
			if tc.config != "" {
				script := "#!/bin/sh\necho '" + filepath.Join(root, tc.config) + "'\n"
				if err := os.WriteFile(filepath.Join(bin, "pg_config"), []byte(script), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			env := map[string]string{}
			if tc.bindir != "" {
				env["PG_BINDIR"] = filepath.Join(root, tc.bindir)
			}
			goDir, goErr := findBinDir(binSearch{getenv: func(k string) string { return env[k] }, root: root,
				lookPath: func(name string) (string, error) {
					p := filepath.Join(bin, name)
					if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
						return p, nil
					}
					return "", exec.ErrNotFound
				},
				pgConfig: func() string {
					out, err := exec.Command(filepath.Join(bin, "pg_config"), "--bindir").Output()
					if err != nil {
						return ""
					}
					return strings.TrimSpace(string(out))
				}})
			if goErr != nil {
				goDir = "not found"
			}

			cmd := exec.Command("bash", filepath.Join("..", "..", ".ci", "setup"), "--dry-run")
			for _, kv := range os.Environ() {
				if k, _, _ := strings.Cut(kv, "="); k != "PG_BINDIR" && k != "HOME" && !strings.HasPrefix(k, "OUTBOX_SETUP_") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			cmd.Env = append(cmd.Env, "HOME="+dir, "OUTBOX_SETUP_ROOT="+root, "OUTBOX_SETUP_PATH="+bin, "OUTBOX_SETUP_PRIVILEGE=none")
			if tc.bindir != "" {
				cmd.Env = append(cmd.Env, "PG_BINDIR="+env["PG_BINDIR"])
			}
			out, _ := cmd.CombinedOutput()
			m := regexp.MustCompile(`(?m)^setup: PostgreSQL server binaries: (.*)$`).FindSubmatch(out)
			if m == nil {
				t.Fatalf(".ci/setup --dry-run does not say where the binaries are:\n%s", out)
			}
			if got := string(m[1]); got != goDir {
				t.Errorf(".ci/setup finds %s, pgcluster finds %s", got, goDir)
			}
		})
	}
}
