package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ModulePath is the module whose binaries the chaos harness builds.
const ModulePath = "github.com/pgoutbox/outbox"

// Binaries are the executables the harness runs.
type Binaries struct {
	// Outbox is the outbox command (relays, and "outbox chaos" itself).
	Outbox string
	// Orders is the example order system (api, inventory).
	Orders string
}

// ModuleRoot returns the directory of this module's go.mod, looking in dir
// and its parents.
func ModuleRoot(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		f, err := os.Open(filepath.Join(d, "go.mod"))
		if err == nil {
			sc := bufio.NewScanner(f)
			module := ""
			for sc.Scan() {
				if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
					module = strings.TrimSpace(rest)
					break
				}
			}
			f.Close()
			if module == ModulePath {
				return d, nil
			}
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod of %s in %s or its parents", ModulePath, dir)
		}
	}
}

// Build compiles cmd/outbox and examples/orders of the module at root into
// dir. race adds -race; tags are passed as -tags (for the deliberately broken
// builds of the checker's own test).
func Build(ctx context.Context, root, dir string, race bool, tags ...string) (Binaries, error) {
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	if race {
		args = append(args, "-race")
	}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	args = append(args, "./cmd/outbox", "./examples/orders")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return Binaries{Outbox: filepath.Join(dir, "outbox"), Orders: filepath.Join(dir, "orders")}, nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	addr, ok := ln.Addr().(*net.TCPAddr)
	if !ok {
		return 0, errors.New("not a TCP address")
	}
	return addr.Port, nil
}
