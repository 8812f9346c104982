package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// relayProc is an `outbox relay` process.
type relayProc struct {
	cmd *exec.Cmd
	log *os.File
}

// startRelays spawns k `outbox relay` processes (default configuration) on
// the space's schema and stream, against databaseURL.
func (e *env) startRelays(k int, s space, databaseURL string, extra ...string) ([]*relayProc, error) {
	bin, err := e.outboxBinary()
	if err != nil {
		return nil, err
	}
	var procs []*relayProc
	for i := 0; i < k; i++ {
		logf, err := os.CreateTemp(e.tmp, "relay-*.log")
		if err != nil {
			return procs, err
		}
		args := append([]string{"relay", "--database-url", databaseURL, "--schema", s.schema,
			"--destination", e.o.natsURL, "--nats-stream", s.stream, "--nats-subject-prefix", s.prefix,
			"--id", fmt.Sprintf("bench-%s-%d", s.schema, i)}, extra...)
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			return procs, err
		}
		procs = append(procs, &relayProc{cmd: cmd, log: logf})
	}
	return procs, nil
}

// stopRelays ends the processes with SIGTERM (their graceful shutdown) and
// waits for them.
func stopRelays(procs []*relayProc) {
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		done := make(chan struct{})
		go func() { _ = p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
		_ = p.log.Close()
	}
}

// peakRSS reads a process's peak resident set size (VmHWM) in MiB.
func peakRSS(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			fs := strings.Fields(rest)
			kb, err := strconv.ParseFloat(fs[0], 64)
			if err != nil {
				return 0, err
			}
			return kb / 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}

// benchScale drains one backlog with 1, 2 and 4 `outbox relay` processes,
// checks I5 on each stream, and reports the peak RSS of the processes.
func benchScale(ctx context.Context, e *env) ([]Result, error) {
	if _, err := e.outboxBinary(); err != nil {
		return nil, err
	}
	n, aggs := e.sz.backlog, e.sz.aggregates
	var out []Result
	var one float64
	var rssOne float64
	type run struct {
		k     int
		extra []string
	}
	var runs []run
	for _, k := range e.sz.scaleCounts {
		runs = append(runs, run{k: k})
	}
	// The same without claiming ahead: a relay then leaves the machine idle
	// between its round trips, and a second one uses that time.
	if e.sz.scaleNoAhead {
		runs = append(runs, run{1, []string{"--no-claim-ahead"}}, run{2, []string{"--no-claim-ahead"}})
	}
	var oneSeq float64
	for _, rn := range runs {
		k := rn.k
		suffix := ""
		if len(rn.extra) > 0 {
			suffix = "-no-claim-ahead"
		}
		s, cleanup, err := e.newSpace(ctx, fmt.Sprintf("scale-%d%s", k, suffix))
		if err != nil {
			return out, err
		}
		if err := e.loadBacklog(ctx, s.schema, n, aggs, "o-", 1<<40, false); err != nil {
			cleanup()
			return out, err
		}
		// The stream exists before the relays start, so they do not race to
		// create it.
		if _, nc, err := e.publisher(ctx, s); err != nil {
			cleanup()
			return out, err
		} else {
			nc.Close()
		}
		start := time.Now()
		procs, err := e.startRelays(k, s, e.o.databaseURL, rn.extra...)
		if err != nil {
			stopRelays(procs)
			cleanup()
			return out, err
		}
		err = e.waitDrained(ctx, s, n, 10*time.Minute)
		elapsed := time.Since(start)
		var rss float64
		for _, p := range procs {
			if v, err := peakRSS(p.cmd.Process.Pid); err == nil && v > rss {
				rss = v
			}
		}
		stopRelays(procs)
		if err != nil {
			cleanup()
			return out, fmt.Errorf("%d relays: %w", k, err)
		}
		distinct, err := e.checkOrder(ctx, s.stream)
		cleanup()
		if err != nil {
			return out, fmt.Errorf("%d relays: %w", k, err)
		}
		if distinct != n {
			return out, fmt.Errorf("%d relays: %d distinct events on the stream, want %d", k, distinct, n)
		}
		rate := float64(n) / elapsed.Seconds()
		res := Result{Scenario: fmt.Sprintf("scale/%d-relay-processes%s", k, suffix), EventsPerSec: f(rate), Events: int64(n), Seconds: elapsed.Seconds(),
			Value: f(rss), Unit: "MB peak RSS", Note: fmt.Sprintf("I5 holds on the stream (%d events)", distinct)}
		switch {
		case k == 1 && suffix == "":
			one, rssOne = rate, rss
		case k == 1:
			oneSeq = rate
			res.Ratio, res.RatioOf = f(rate/one), "scale/1-relay-processes"
			res.Note += "; outbox relay --no-claim-ahead"
		case suffix != "":
			res.Ratio, res.RatioOf = f(rate/oneSeq), "scale/1-relay-processes-no-claim-ahead"
			res.Note += "; outbox relay --no-claim-ahead"
		default:
			res.Ratio, res.RatioOf = f(rate/one), "scale/1-relay-processes"
			if k == 2 {
				res.Target, res.Met = ">= 1.30", b(rate/one >= 1.3)
			}
		}
		e.logf("%s: %.0f events/s (%s), peak RSS %.1f MB, I5 holds", res.Scenario, rate, elapsed.Round(time.Millisecond), rss)
		out = append(out, res)
	}
	out = append(out, Result{Scenario: "memory/relay-peak-rss", Value: f(rssOne), Unit: "MB",
		Target: "<= 100 MB", Met: b(rssOne <= 100),
		Note: fmt.Sprintf("VmHWM of one `outbox relay` process draining %d events", n)})
	return out, nil
}
