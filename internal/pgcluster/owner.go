//go:build unix

package pgcluster

// Who a cluster belongs to: the user its server runs as (when the caller
// is root), the process that owns it, and the removal of clusters whose
// owning process died without closing them (SIGKILL).

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// maxSocketPath is the longest Unix socket path the kernel takes
// (sun_path: 108 bytes on Linux with its NUL, 104 on the BSDs and macOS).
const maxSocketPath = 103

// shortTempDir is where a short socket directory is made when the
// temporary directory's path is too long for a socket.
const shortTempDir = "/tmp"

// ownerFile, in a cluster's directory, names the process that owns it:
// "pid start-time" (the start time tells a reused pid apart).
const ownerFile = "owner"

// serverUser is the user the server runs as when the caller is root:
// postgres, or nobody where there is none.
func serverUser() (*user.User, error) {
	u, err := user.Lookup("postgres")
	if err == nil {
		return u, nil
	}
	if n, nerr := user.Lookup("nobody"); nerr == nil {
		return n, nil
	}
	return nil, fmt.Errorf("pgcluster: initdb and postgres refuse to run as root, and neither the postgres user nor nobody exists to run them: %w", err)
}

// baseDir is where the cluster's directory is made: the temporary
// directory, or, when the server's user cannot reach it (a TMPDIR under
// /root), shortTempDir.
func (c *Cluster) baseDir() (string, error) {
	base := os.TempDir()
	if c.owner == nil || reachable(base) {
		return base, nil
	}
	if reachable(shortTempDir) {
		return shortTempDir, nil
	}
	return "", fmt.Errorf("pgcluster: the server runs as %s, who cannot reach %s nor %s: set TMPDIR to a directory every user may enter", c.owner.Username, base, shortTempDir)
}

// reachable reports whether every user may enter dir and each directory
// above it.
func reachable(dir string) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for {
		fi, err := os.Stat(dir)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return true
		}
		dir = parent
	}
}

// asUser makes cmd run as u (nil: as the caller), with its HOME.
func asUser(cmd *exec.Cmd, u *user.User) error {
	if u == nil {
		return nil
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return fmt.Errorf("pgcluster: user %s: uid %q: %w", u.Username, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return fmt.Errorf("pgcluster: user %s: gid %q: %w", u.Username, u.Gid, err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}
	cmd.Env = append(os.Environ(), "HOME="+u.HomeDir)
	return nil
}

// processStart is the start time of process pid (field 22 of
// /proc/PID/stat), "" where there is no /proc; ok is false when the
// process does not exist.
func processStart(pid int) (start string, ok bool) {
	if pid <= 0 {
		return "", false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return "", false
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "", true
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return "", true
	}
	fields := strings.Fields(string(b[i+1:])) // from field 3, the state
	if len(fields) < 20 {
		return "", true
	}
	return fields[19], true
}

// writeOwner records this process as the owner of the cluster in dir.
func writeOwner(dir string) error {
	start, _ := processStart(os.Getpid())
	return os.WriteFile(filepath.Join(dir, ownerFile), []byte(fmt.Sprintf("%d %s\n", os.Getpid(), start)), 0o644)
}

// ownerAlive reports whether the process that owns the cluster in dir
// still runs; a directory without an owner (being made, kept, or made by
// an older version) counts as alive.
func ownerAlive(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, ownerFile))
	if err != nil {
		return true
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return true
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil {
		return true
	}
	start, ok := processStart(pid)
	if !ok {
		return false
	}
	return len(f) < 2 || start == "" || start == f[1]
}

var leftovers sync.Once

func removeLeftoversOnce() {
	leftovers.Do(func() {
		dirs := []string{os.TempDir()}
		if filepath.Clean(os.TempDir()) != shortTempDir {
			dirs = append(dirs, shortTempDir)
		}
		for _, d := range dirs {
			RemoveLeftovers(d)
		}
	})
}

// RemoveLeftovers removes the clusters under base (made by Start there)
// whose owning process is gone, stopping their servers first, and returns
// the directories it removed. Start calls it once per process on the
// temporary directory.
func RemoveLeftovers(base string) []string {
	matches, _ := filepath.Glob(filepath.Join(base, dirPrefix+"*"))
	var removed []string
	for _, dir := range matches {
		if ownerAlive(dir) {
			continue
		}
		stopServer(filepath.Join(dir, "data"))
		if b, err := os.ReadFile(filepath.Join(dir, "socket-dir")); err == nil {
			if sock := strings.TrimSpace(string(b)); strings.HasPrefix(filepath.Base(sock), sockPrefix) {
				_ = os.RemoveAll(sock)
			}
		}
		if os.RemoveAll(dir) == nil {
			removed = append(removed, dir)
		}
	}
	return removed
}

// stopServer stops the postmaster of data directory data, if one runs
// (immediate shutdown, then SIGKILL after 10 s). It checks that the pid in
// postmaster.pid is a server of that directory before it signals it.
func stopServer(data string) {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return
	}
	if cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline")); err == nil &&
		!bytes.Contains(cmdline, []byte(data)) {
		return // the pid was reused
	}
	if syscall.Kill(pid, syscall.SIGQUIT) != nil {
		return
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			return
		}
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}
