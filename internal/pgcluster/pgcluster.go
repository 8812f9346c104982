// Package pgcluster starts a private PostgreSQL cluster: its own data
// directory, a free port on 127.0.0.1, settings of the caller's choosing
// (wal_level=logical, ssl=on, a tiny max_slot_wal_keep_size). Tests that
// must crash, restart or reconfigure PostgreSQL use it, never the shared
// server; so does `outbox demo --mode cdc`.
//
// It needs PostgreSQL's server binaries (initdb, pg_ctl). They are looked
// for in PG_BINDIR; else in `pg_config --bindir`; else in the Debian and
// Ubuntu layout (/usr/lib/postgresql/<version>/bin), Homebrew's
// (/opt/homebrew/opt/postgresql@<version>/bin, /usr/local/opt/...),
// Postgres.app's and the PGDG RPMs' (/usr/pgsql-<version>/bin), newest
// version first; else on the PATH (Fedora's /usr/bin). When none has them,
// the error (ErrNoBinaries) says what to install on each system.
// When the caller is root the tools run as the postgres user (nobody where
// there is none), because initdb and postgres refuse to run as root; the
// cluster's directory is then made where that user can reach it.
//
// initdb runs once for the clusters a process has at a time: Start copies
// the data directory of a template that initdb made, removed with the last
// of them (template.go).
//
// A cluster outlives a process killed without a chance to Close it
// (SIGKILL): its directory records the process that owns it, and the next
// Start of any process removes the clusters whose owner is gone, stopping
// their servers first, and the owner's template. Keep hands a cluster over
// to its user: it is never removed.
package pgcluster

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Config says how to set the cluster up.
type Config struct {
	// Settings are extra server settings, passed as -c name=value at every
	// start (for example "wal_level": "logical").
	Settings map[string]string
	// Prepare, when set, runs after initdb and before the first start, with
	// the data directory: a test writes certificates or pg_hba.conf there.
	// Files it writes are handed to the cluster's owner afterwards.
	Prepare func(dataDir string) error
}

// Cluster is a private PostgreSQL cluster. Close stops it and removes its
// directory.
type Cluster struct {
	dir, data string
	sock      string // the Unix socket's directory: dir, or a short one when dir is too long
	port      int
	settings  map[string]string
	owner     *user.User // the user the server runs as when the caller is root
	template  string     // the key of the template its data directory was copied from (initData)

	mu      sync.Mutex
	running bool
}

// ErrNoBinaries is returned (wrapped) by Available, Start and Tool when
// PostgreSQL's server binaries are not found; the message says what to
// install on Debian/Ubuntu, Fedora and macOS, or which container to run
// instead.
var ErrNoBinaries = errors.New(`PostgreSQL's server binaries (initdb, pg_ctl) were not found; install them:
  Debian/Ubuntu: sudo apt-get install postgresql
  Fedora:        sudo dnf install postgresql-server
  macOS:         brew install postgresql@17
or set PG_BINDIR to the directory that holds initdb; or run a server in a container instead:
  docker run -d --name outbox-postgres -p 127.0.0.1:5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:17`)

// Available reports whether the server binaries are present, and if not,
// what is missing and how to install it (an error wrapping ErrNoBinaries).
func Available() error {
	_, err := binDir()
	return err
}

// BinDir is the directory of the server binaries Start uses (see the
// package documentation for where they are looked for).
func BinDir() (string, error) { return binDir() }

func binDir() (string, error) {
	return findBinDir(binSearch{
		getenv: os.Getenv, root: "/", lookPath: exec.LookPath,
		pgConfig: func() string {
			out, err := exec.Command("pg_config", "--bindir").Output()
			if err != nil {
				return ""
			}
			return strings.TrimSpace(string(out))
		},
	})
}

// binSearch is where findBinDir looks: the environment, the file system
// root the fixed layouts are under, the PATH and pg_config (replaceable in
// tests).
type binSearch struct {
	getenv   func(string) string
	root     string
	lookPath func(string) (string, error)
	pgConfig func() string
}

// layouts are the fixed places server binaries are installed in, as globs
// under the root; within one glob the newest version comes first.
var layouts = []string{
	"usr/lib/postgresql/*/bin",                       // Debian, Ubuntu (postgresql-common)
	"opt/homebrew/opt/postgresql@*/bin",              // Homebrew on Apple silicon
	"usr/local/opt/postgresql@*/bin",                 // Homebrew on Intel
	"home/linuxbrew/.linuxbrew/opt/postgresql@*/bin", // Homebrew on Linux
	"opt/homebrew/opt/postgresql/bin",
	"usr/local/opt/postgresql/bin",
	"Applications/Postgres.app/Contents/Versions/latest/bin",
	"usr/pgsql-*/bin", // the PGDG RPMs (Fedora, RHEL)
}

func findBinDir(s binSearch) (string, error) {
	has := func(dir string) bool {
		fi, err := os.Stat(filepath.Join(dir, "initdb"))
		return err == nil && !fi.IsDir()
	}
	if d := s.getenv("PG_BINDIR"); d != "" {
		if !has(d) {
			return "", fmt.Errorf("pgcluster: PG_BINDIR=%s has no initdb: %w", d, ErrNoBinaries)
		}
		return d, nil
	}
	if d := s.pgConfig(); d != "" && has(d) {
		return d, nil
	}
	for _, layout := range layouts {
		dirs, _ := filepath.Glob(filepath.Join(s.root, layout))
		sort.SliceStable(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
		for _, d := range dirs {
			if has(d) {
				return d, nil
			}
		}
	}
	if p, err := s.lookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("pgcluster: %w", ErrNoBinaries)
}

var versionRE = regexp.MustCompile(`(\d+)(?:\.\d+)?$`)

// version is the major version in the name of a binaries directory's
// parent (15, postgresql@17, pgsql-16), 0 when it has none.
func version(binDir string) int {
	m := versionRE.FindStringSubmatch(filepath.Base(filepath.Dir(binDir)))
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// dirPrefix begins the name of every cluster's directory (under the
// temporary directory), sockPrefix that of a short socket directory.
const (
	dirPrefix  = "outbox-pg-"
	sockPrefix = "outbox-pgs-"
)

// Start creates a cluster in a new temporary directory and starts it. It
// first removes the clusters of processes that died without closing them.
func Start(cfg Config) (*Cluster, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	removeLeftoversOnce()
	c := &Cluster{settings: cfg.Settings}
	if os.Geteuid() == 0 {
		var err error
		if c.owner, err = serverUser(); err != nil {
			return nil, err
		}
	}
	base, err := c.baseDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(base, dirPrefix)
	if err != nil {
		return nil, err
	}
	c.dir, c.data, c.sock = dir, filepath.Join(dir, "data"), dir
	fail := func(err error) (*Cluster, error) {
		c.removeDirs()
		return nil, err
	}
	if err := writeOwner(dir); err != nil {
		return fail(err)
	}
	if err := c.chown(dir); err != nil {
		return fail(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fail(err)
	}
	if len(filepath.Join(dir, ".s.PGSQL.65535.lock")) > maxSocketPath {
		// A long TMPDIR: the socket's path would not fit in sun_path.
		if c.sock, err = os.MkdirTemp(shortTempDir, sockPrefix); err != nil {
			return fail(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "socket-dir"), []byte(c.sock), 0o644); err != nil {
			return fail(err)
		}
		if err := c.chown(c.sock); err != nil {
			return fail(err)
		}
	}
	if err := c.initData(base); err != nil {
		return fail(err)
	}
	if cfg.Prepare != nil {
		if err := cfg.Prepare(c.data); err != nil {
			return fail(fmt.Errorf("pgcluster: prepare: %w", err))
		}
		if err := c.chownTree(c.data); err != nil {
			return fail(err)
		}
	}
	if c.port, err = freePort(); err != nil {
		return fail(err)
	}
	if err := c.Start(); err != nil {
		return fail(err)
	}
	return c, nil
}

// Port is the TCP port the cluster listens on (127.0.0.1).
func (c *Cluster) Port() int { return c.port }

// DataDir is the cluster's data directory.
func (c *Cluster) DataDir() string { return c.data }

// URL is a connection URL for database db (postgres when empty) as the
// postgres superuser, without TLS.
func (c *Cluster) URL(db string) string {
	if db == "" {
		db = "postgres"
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// Start starts the stopped cluster (after Crash or Stop) and waits until
// it accepts connections.
func (c *Cluster) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		return nil
	}
	if err := c.run("pg_ctl", c.startArgs()...); err != nil {
		return fmt.Errorf("%w\nthe end of the server's log (%s):\n%s", err, filepath.Join(c.dir, "log"), tail(c.Log(), 20))
	}
	c.running = true
	return nil
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// startArgs are pg_ctl's arguments that start the cluster.
func (c *Cluster) startArgs() []string {
	opts := []string{
		fmt.Sprintf("-p %d", c.port),
		"-c listen_addresses=127.0.0.1",
		"-c unix_socket_directories=" + c.sock,
		"-c max_connections=60",
		"-c shared_buffers=32MB",
	}
	keys := make([]string, 0, len(c.settings))
	for k := range c.settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		opts = append(opts, fmt.Sprintf("-c %s=%s", k, c.settings[k]))
	}
	return []string{"-D", c.data, "-o", strings.Join(opts, " "), "-l", filepath.Join(c.dir, "log"), "-w", "-t", "60", "start"}
}

// Crash stops the cluster the hard way (immediate shutdown: no
// checkpoint, crash recovery at the next start), dropping every
// connection.
func (c *Cluster) Crash() error { return c.stop("immediate") }

// Stop shuts the cluster down cleanly (fast mode: sessions are ended, a
// checkpoint is written).
func (c *Cluster) Stop() error { return c.stop("fast") }

func (c *Cluster) stop(mode string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running {
		return nil
	}
	if err := c.run("pg_ctl", "-D", c.data, "-m", mode, "-w", "stop"); err != nil {
		return err
	}
	c.running = false
	return nil
}

// Log is the server's log so far, for a failing test to show.
func (c *Cluster) Log() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "log"))
	return string(b)
}

// Dir is the cluster's directory: the data directory (DataDir), the
// server's log and its socket. Close removes it.
func (c *Cluster) Dir() string { return c.dir }

// Keep shuts the cluster down cleanly and leaves its directory in place
// instead of Close, for someone to inspect; it returns the shell command
// that starts the cluster again. Nothing else (Close included) may be
// called afterwards.
func (c *Cluster) Keep() (restart string, err error) {
	if err := c.Stop(); err != nil {
		return "", err
	}
	c.releaseTemplate()
	// Kept for its user: no later Start may take it for a leftover.
	if err := os.Remove(filepath.Join(c.dir, ownerFile)); err != nil {
		return "", err
	}
	bin, err := binDir()
	if err != nil {
		return "", err
	}
	words := append([]string{filepath.Join(bin, "pg_ctl")}, c.startArgs()...)
	if c.owner != nil {
		words = append([]string{"runuser", "-u", c.owner.Username, "--"}, words...)
	}
	for i, w := range words {
		if strings.ContainsAny(w, " '\"$\\") {
			words[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
		}
	}
	return strings.Join(words, " "), nil
}

// Close stops the cluster (immediately) and removes its directory.
func (c *Cluster) Close() error {
	err := c.Crash()
	if rmErr := c.removeDirs(); err == nil {
		err = rmErr
	}
	return err
}

// removeDirs removes the cluster's directory and its socket's, and lets go
// of its template.
func (c *Cluster) removeDirs() error {
	c.releaseTemplate()
	err := os.RemoveAll(c.dir)
	if c.sock != c.dir {
		err = errors.Join(err, os.RemoveAll(c.sock))
	}
	return err
}

// run runs a PostgreSQL tool, as the cluster's owner when the caller is
// root, in the cluster's directory.
func (c *Cluster) run(tool string, args ...string) error {
	bin, err := binDir()
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(bin, tool), args...)
	cmd.Dir = c.dir
	if err := asUser(cmd, c.owner); err != nil {
		return err
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "No space left on device") {
			return fmt.Errorf("pgcluster: %s: the file system of %s is full (no space left on device): free some space there, or set TMPDIR to a directory on a file system with room (a cluster takes about 40 MB)\n%s",
				tool, c.dir, tail(string(out), 10))
		}
		return fmt.Errorf("pgcluster: %s %s: %v\n%s", tool, strings.Join(args, " "), err, out)
	}
	return nil
}

func (c *Cluster) chown(path string) error {
	if c.owner == nil {
		return nil
	}
	uid, _ := strconv.Atoi(c.owner.Uid)
	gid, _ := strconv.Atoi(c.owner.Gid)
	return os.Chown(path, uid, gid)
}

func (c *Cluster) chownTree(root string) error {
	if c.owner == nil {
		return nil
	}
	return filepath.Walk(root, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return c.chown(path)
	})
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Tool returns the path of one of the server's programs (pg_recvlogical,
// pg_waldump, ...), from the directory whose initdb Start uses.
func Tool(name string) (string, error) {
	d, err := binDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, name), nil
}
