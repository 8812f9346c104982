package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Sink receives every line a child process writes (stdout and stderr),
// prefixed by nothing; name is the process's name.
type Sink func(name, line string)

// ProcessSpec describes a child process.
type ProcessSpec struct {
	// Name labels the process in logs and reports.
	Name string
	// Path is the executable, Args its arguments (without argv[0]).
	Path string
	Args []string
	// Env is the complete environment; nil means the parent's.
	Env []string
}

// maxLines bounds the log lines a Process keeps for WaitLine and Lines.
const maxLines = 20000

// Process is a running (or ended) child process whose output lines go to a
// Sink and are kept for WaitLine. The child gets SIGKILL if the parent dies
// first (PR_SET_PDEATHSIG), so a crashed test leaves no process behind.
type Process struct {
	spec ProcessSpec
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has been reaped

	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed and replaced when a line arrives
	err     error         // cmd.Wait's result
}

// StartProcess starts spec, sending its output lines to sink (which may be
// nil).
func StartProcess(spec ProcessSpec, sink Sink) (*Process, error) {
	cmd := exec.Command(spec.Path, spec.Args...)
	cmd.Env = spec.Env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return nil, fmt.Errorf("start %s: %w", spec.Name, err)
	}
	pw.Close() // the child holds its own copy
	p := &Process{spec: spec, cmd: cmd, done: make(chan struct{}), changed: make(chan struct{})}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		p.read(pr, sink)
	}()
	go func() {
		err := cmd.Wait()
		<-readDone // every line is in before Done reports the end
		p.mu.Lock()
		p.err = err
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

func (p *Process) read(r io.ReadCloser, sink Sink) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if sink != nil {
			sink(p.spec.Name, line)
		}
		p.mu.Lock()
		if len(p.lines) == maxLines {
			copy(p.lines, p.lines[maxLines/2:])
			p.lines = p.lines[:maxLines/2]
		}
		p.lines = append(p.lines, line)
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}
}

// Name is the process's name.
func (p *Process) Name() string { return p.spec.Name }

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has ended and its output was read.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is the process's exit error (nil for exit code 0); valid after Done.
func (p *Process) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Signaled returns the signal that ended the process, or 0 when it exited
// by itself (or is still running).
func (p *Process) Signaled() syscall.Signal {
	if !p.Exited() {
		return 0
	}
	st := p.cmd.ProcessState
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.Signal()
	}
	return 0
}

// Signal sends sig to the process; a process that has ended is not an
// error.
func (p *Process) Signal(sig syscall.Signal) error {
	if p.Exited() {
		return nil
	}
	err := p.cmd.Process.Signal(sig)
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}

// Kill sends SIGKILL and waits until the process is gone.
func (p *Process) Kill() {
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM (and SIGCONT, in case it is paused) and waits up to
// timeout for the process to end; then it kills it. It returns the exit
// error of a process that ended by itself, or an error saying it had to be
// killed.
func (p *Process) Stop(timeout time.Duration) error {
	_ = p.Signal(syscall.SIGTERM)
	_ = p.Signal(syscall.SIGCONT)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return p.Err()
	case <-t.C:
		p.Kill()
		return fmt.Errorf("%s did not stop within %s of SIGTERM; killed", p.spec.Name, timeout)
	}
}

// Lines returns the output lines kept so far (the most recent maxLines/2
// at least).
func (p *Process) Lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// CountLines counts the kept lines containing s.
func (p *Process) CountLines(s string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.lines {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

// WaitLine waits until the process has written a line matching re and
// returns its submatches. It fails when ctx ends or the process ends
// without such a line.
func (p *Process) WaitLine(ctx context.Context, re *regexp.Regexp) ([]string, error) {
	seen := 0
	for {
		p.mu.Lock()
		lines, changed := p.lines, p.changed
		p.mu.Unlock()
		if seen > len(lines) {
			seen = 0 // the buffer was compacted
		}
		for ; seen < len(lines); seen++ {
			if m := re.FindStringSubmatch(lines[seen]); m != nil {
				return m, nil
			}
		}
		if p.Exited() {
			return nil, fmt.Errorf("%s ended (%v) without logging %q", p.spec.Name, p.Err(), re)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("%s did not log %q: %w", p.spec.Name, re, ctx.Err())
		}
	}
}
