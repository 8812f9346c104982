//go:build !unix

package pgcluster

import (
	"errors"
	"os"
	"os/exec"
	"os/user"
)

const maxSocketPath = 103

var shortTempDir = os.TempDir()

const ownerFile = "owner"

func serverUser() (*user.User, error) {
	return nil, errors.New("pgcluster: running as root is supported on Unix only")
}

func (c *Cluster) baseDir() (string, error) { return os.TempDir(), nil }

func asUser(*exec.Cmd, *user.User) error { return nil }

func writeOwner(dir string) error {
	return os.WriteFile(dir+string(os.PathSeparator)+ownerFile, nil, 0o644)
}

func removeLeftoversOnce() {}

// RemoveLeftovers does nothing outside Unix.
func RemoveLeftovers(string) []string { return nil }
