package pgcluster

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// templates are data directories made by initdb that Start copies instead
// of running initdb for every cluster: initdb bootstraps the catalogues,
// about a second and a half of CPU on a quiet machine and several seconds
// on a loaded one (CI's 2-core machine, where a package's tests start
// dozens of clusters), and a copy of its 40 MB takes a fraction of that.
// There is one per temporary directory and set of server binaries (a test
// may change TMPDIR or PG_BINDIR). A template lives as long as a cluster
// of the process made from it: the last one's Close (or Keep) removes it,
// and the next Start makes another. Its directory is named and owned like
// a cluster's, so that RemoveLeftovers sweeps a killed process's template
// with its clusters.
var templates = struct {
	mu sync.Mutex
	m  map[string]*template
}{m: map[string]*template{}}

type template struct {
	dir  string // data directory in dir/data
	refs int    // clusters made from it, neither closed nor kept yet
}

// templatePrefix begins a template's directory name (within dirPrefix).
const templatePrefix = dirPrefix + "template-"

// initData makes the cluster's data directory: a copy of the template of
// base and the server binaries, made first when there is none.
func (c *Cluster) initData(base string) error {
	bin, err := binDir()
	if err != nil {
		return err
	}
	key := base + "\x00" + bin
	templates.mu.Lock()
	defer templates.mu.Unlock()
	tp := templates.m[key]
	if tp == nil {
		dir, err := os.MkdirTemp(base, templatePrefix)
		if err != nil {
			return err
		}
		t := &Cluster{dir: dir, owner: c.owner}
		err = writeOwner(dir)
		if err == nil {
			err = t.chown(dir)
		}
		if err == nil {
			err = os.Chmod(dir, 0o755)
		}
		if err == nil {
			err = t.run("initdb", "-D", filepath.Join(dir, "data"), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync", "--no-instructions")
		}
		if err != nil {
			_ = os.RemoveAll(dir)
			return err
		}
		tp = &template{dir: dir}
		templates.m[key] = tp
	}
	if err := c.copyTree(filepath.Join(tp.dir, "data"), c.data); err != nil {
		if tp.refs == 0 {
			delete(templates.m, key)
			_ = os.RemoveAll(tp.dir)
		}
		return err
	}
	tp.refs++
	c.template = key
	return nil
}

// releaseTemplate drops the cluster's hold on its template, removing the
// template when no cluster of the process holds it any more.
func (c *Cluster) releaseTemplate() {
	if c.template == "" {
		return
	}
	templates.mu.Lock()
	defer templates.mu.Unlock()
	if tp := templates.m[c.template]; tp != nil {
		if tp.refs--; tp.refs <= 0 {
			delete(templates.m, c.template)
			_ = os.RemoveAll(tp.dir)
		}
	}
	c.template = ""
}

// copyTree copies the directory src to dst (which must not exist), with
// the same permissions, owned by the cluster's owner.
func (c *Cluster) copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(to, info.Mode().Perm()); err != nil {
				return err
			}
		case d.Type().IsRegular():
			if err := copyFile(path, to, info.Mode().Perm()); err != nil {
				return err
			}
		default:
			return errors.New("pgcluster: template " + path + " is neither a directory nor a file")
		}
		if err := os.Chmod(to, info.Mode().Perm()); err != nil {
			return err
		}
		return c.chown(to)
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
