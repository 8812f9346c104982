package main

import (
	"cmp"
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
)

// phaseStats are one phase's figures.
type phaseStats struct {
	kind, name, cell string
	recovery         bool
	dur              time.Duration
	offered          int
	committed        int
	rolledBack       int
	uncertain        int
	writerErrs       int64
	firstWriterErr   string
	rate             float64 // committed/s
	p50, p99, max    float64 // ms, commit to arrival at the consumer
	late2s           int     // events later than 2 s
	lateLease        int     // events later than half a lease
	lost             int
	phantoms         int
	outOfOrder       int
	duplicates       int // deliveries beyond the first, at the consumer
	republished      int // events published more than once (seen on the wire)
	republishedLease int // ... whose repeat came at least 2/3 of a lease after the first
	backlogMax       int64
	backlogEnd       int64
	backlogSeries    []int64
	pendingMax       int64 // the optional count(*) (-1 when not counted)
	deadMax, deadEnd int64
	autovacuums      int64
	claimFirst       float64 // ms, mean claim in the first window of the phase
	claimLast        float64 // ms, in the last window
	claimWindow      time.Duration
	claimBufFirst    float64 // buffers of the incremental claims per event they claimed (pg_stat_statements), first window
	claimBufLast     float64 // ... last window
	claimSrvFirst    float64 // ms of the server's execution per incremental claim, first window
	claimSrvLast     float64 // ... last window
	claimMean        float64
	markMean         float64
	fullScans        float64 // background full scans in the phase (statement="full_scan")
	fullMean         float64 // their mean duration, ms
	readySamples     int
	notReady         int // /readyz samples other than 200
	expired          float64
	conflicts        float64
	cdcLeft          float64
	takeovers        int
	noStreamer       int // seconds with no relay streaming (CDC)
	kills            int
	killed           map[string]int
	held             int
	readerLoops      int64
	takeover         *takeover
	logErrors        int
	replTimeouts     int
	load             string        // 1-minute load average at the end
	recoveredIn      time.Duration // recovery phases: -1 when no 10 s window is back to the clean p99 (x1.5) within the phase
	p99After         float64       // recovery phases: p99 of the events committed from recoveredIn to the phase's end
	cleanP99         float64
	notes            []string
}

func (st phaseStats) line() string {
	s := fmt.Sprintf("%-20s %5.0f/s p50 %7.1f p99 %8.1f max %8.1f ms, >2s %d, backlog max %d end %d, dead max %d, claim %.2f→%.2f ms, readyz non-200 %d/%d, republished %d (%d after a lease), expired claims %.0f, kills %d, lost %d phantom %d out-of-order %d dup %d",
		st.name, st.rate, st.p50, st.p99, st.max, st.late2s, st.backlogMax, st.backlogEnd, st.deadMax, st.claimFirst, st.claimLast,
		st.notReady, st.readySamples, st.republished, st.republishedLease, st.expired, st.kills, st.lost, st.phantoms, st.outOfOrder, st.duplicates)
	if st.recovery {
		s += fmt.Sprintf(", recovered in %s", recoveredString(st.recoveredIn))
		if st.recoveredIn >= 0 {
			s += fmt.Sprintf(" (p99 %.1f ms from then to the end)", st.p99After)
		}
	}
	if !math.IsNaN(st.claimBufFirst) {
		s += fmt.Sprintf(", claim buffers/event %.1f→%.1f, server %.2f→%.2f ms/claim", st.claimBufFirst, st.claimBufLast, st.claimSrvFirst, st.claimSrvLast)
	}
	if st.takeovers > 0 || st.noStreamer > 0 || st.cdcLeft > 0 {
		s += fmt.Sprintf(", takeovers %d, no streamer %d s, left to the safety net %.0f", st.takeovers, st.noStreamer, st.cdcLeft)
	}
	if st.logErrors > 0 || st.replTimeouts > 0 {
		s += fmt.Sprintf(", server log ERRORs %d (replication timeouts %d)", st.logErrors, st.replTimeouts)
	}
	if st.writerErrs > 0 {
		s += fmt.Sprintf(", writer errors %d (%s)", st.writerErrs, st.firstWriterErr)
	}
	if len(st.killed) > 0 {
		s += ", killed: " + killedString(st.killed)
	}
	for _, n := range st.notes {
		s += "; " + n
	}
	return s
}

func recoveredString(d time.Duration) string {
	if d < 0 {
		return "not within the phase"
	}
	return d.String()
}

func killedString(m map[string]int) string {
	type kv struct {
		k string
		v int
	}
	var kvs []kv
	for k, v := range m {
		kvs = append(kvs, kv{k, v})
	}
	sort.Slice(kvs, func(i, j int) bool { return kvs[i].v > kvs[j].v || kvs[i].v == kvs[j].v && kvs[i].k < kvs[j].k })
	var parts []string
	for i, p := range kvs {
		if i == 4 {
			parts = append(parts, fmt.Sprintf("%d others", len(kvs)-4))
			break
		}
		parts = append(parts, fmt.Sprintf("%d× %q", p.v, p.k))
	}
	return strings.Join(parts, ", ")
}

// compute fills o.stats from the ledger, the ticks and the phases.
func (o *pressureOutcome) compute(sz pressureSizes) {
	l := o.l
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(o.phases)
	lats := make([][]time.Duration, n)
	commitsAt := make([][]int64, n) // commit times, in lats' order
	stats := make([]phaseStats, n)
	for i, ph := range o.phases {
		stats[i] = phaseStats{kind: o.kind, name: ph.name, cell: ph.cell, recovery: ph.recovery, dur: ph.end.Sub(ph.start),
			offered: ph.rate, writerErrs: ph.writerErrs.Load(), kills: ph.kills, killed: ph.killed, held: ph.held,
			readerLoops: ph.readerLoops, takeover: ph.takeover, notes: ph.notes, pendingMax: -1, recoveredIn: -1, p99After: math.NaN(), load: ph.load}
		if p := ph.firstErr.Load(); p != nil {
			stats[i].firstWriterErr = shorten(*p, 160)
		}
	}
	for _, ev := range l.ev {
		if ev.phase < 0 || int(ev.phase) >= n {
			continue
		}
		st := &stats[ev.phase]
		switch ev.state {
		case evRolledBack:
			st.rolledBack++
			continue
		case evUncertain:
			st.uncertain++
			continue
		case evInFlight:
			continue
		}
		st.committed++
		if ev.deliveries > 1 {
			st.duplicates += int(ev.deliveries - 1)
		}
		if ev.arrive == 0 {
			st.lost++
			continue
		}
		d := time.Duration(max(0, ev.arrive-ev.commit))
		lats[ev.phase] = append(lats[ev.phase], d)
		commitsAt[ev.phase] = append(commitsAt[ev.phase], ev.commit)
		if d > 2*time.Second {
			st.late2s++
		}
		if d > sz.lease/2 {
			st.lateLease++
		}
	}
	for _, oo := range l.outOfOrder {
		if ph := l.ev[oo.ix].phase; ph >= 0 && int(ph) < n {
			stats[ph].outOfOrder++
		}
	}
	phaseOf := func(at int64) int {
		for i, ph := range o.phases {
			if at >= ph.start.UnixNano() && at < ph.end.UnixNano() {
				return i
			}
		}
		return -1
	}
	counted := map[int32]bool{}
	for _, r := range l.republ { // in order: an event's first repeat comes first
		if counted[r.ix] {
			continue
		}
		counted[r.ix] = true
		if i := phaseOf(r.at); i >= 0 {
			stats[i].republished++
			if r.gap >= sz.lease*2/3 {
				stats[i].republishedLease++
			}
		}
	}
	cleanP99 := math.NaN()
	for i, ph := range o.phases {
		st := &stats[i]
		st.rate = float64(st.committed) / st.dur.Seconds()
		st.p50, st.p99, st.max = percentiles(lats[i])
		// Ticks of the phase.
		var in []pressureTick
		var before *pressureTick
		for k := range o.ticks {
			tk := &o.ticks[k]
			if tk.at.Before(ph.start) {
				before = tk
				continue
			}
			if !tk.at.Before(ph.end) {
				break
			}
			in = append(in, *tk)
		}
		for _, tk := range in {
			st.backlogMax = max(st.backlogMax, tk.backlog)
			st.backlogSeries = append(st.backlogSeries, tk.backlog)
			st.deadMax = max(st.deadMax, tk.dead)
			st.pendingMax = max(st.pendingMax, tk.pending)
			for _, code := range tk.ready {
				st.readySamples++
				if code != 200 {
					st.notReady++
				}
			}
		}
		if len(in) > 0 {
			last := in[len(in)-1]
			st.backlogEnd, st.deadEnd = last.backlog, last.dead
			first := in[0]
			if before != nil {
				first = *before
			}
			st.autovacuums = last.autovac - first.autovac
			d := func(f func(relayMetrics) float64) float64 { return sumM(last.m, f) - sumM(first.m, f) }
			st.expired = d(func(m relayMetrics) float64 { return m.expired })
			st.conflicts = d(func(m relayMetrics) float64 { return m.conflicts })
			st.cdcLeft = d(func(m relayMetrics) float64 { return m.cdcLeft })
			st.claimMean = meanMs(first, last, claimOf)
			st.markMean = meanMs(first, last, markOf)
			st.fullScans = d(func(m relayMetrics) float64 { return m.fullCount })
			st.fullMean = meanMs(first, last, fullOf)
			// Claim time in the first and the last window of the phase.
			w := min(time.Minute, st.dur/3)
			st.claimWindow = w
			st.claimFirst = 1000 * windowMean(o.ticks, ph.start, ph.start.Add(w), ofRelays(claimOf))
			st.claimLast = 1000 * windowMean(o.ticks, ph.end.Add(-w), ph.end, ofRelays(claimOf))
			st.claimBufFirst = windowMean(o.ticks, ph.start, ph.start.Add(w), claimBuffersOf)
			st.claimBufLast = windowMean(o.ticks, ph.end.Add(-w), ph.end, claimBuffersOf)
			st.claimSrvFirst = windowMean(o.ticks, ph.start, ph.start.Add(w), claimServerOf)
			st.claimSrvLast = windowMean(o.ticks, ph.end.Add(-w), ph.end, claimServerOf)
			// CDC: which relay streams, second by second.
			prev := -1
			for _, tk := range append([]pressureTick{first}, in...) {
				s := -1
				for k, m := range tk.m {
					if m.streaming == 1 {
						s = k
					}
				}
				if s < 0 && o.kind == "cdc" {
					st.noStreamer++
				}
				if s >= 0 && prev >= 0 && s != prev {
					st.takeovers++
				}
				if s >= 0 {
					prev = s
				}
			}
			if o.kind == "cdc" && before == nil && st.noStreamer > 0 {
				st.noStreamer-- // first was counted twice
			}
		}
		logPart := ""
		if ph.logTo <= len(o.serverLog) && ph.logFrom <= ph.logTo {
			logPart = o.serverLog[ph.logFrom:ph.logTo]
		}
		st.logErrors = strings.Count(logPart, "ERROR:")
		st.replTimeouts = strings.Count(logPart, "replication timeout")
		if ph.cell == "clean" && !ph.recovery {
			cleanP99 = st.p99
		}
		st.cleanP99 = cleanP99
		if ph.recovery && !math.IsNaN(cleanP99) {
			st.recoveredIn, st.p99After = recoveredIn(lats[i], commitsAt[i], ph.start, ph.end, cleanP99)
		}
	}
	o.stats = stats
}

func sumM(ms []relayMetrics, f func(relayMetrics) float64) float64 {
	s := 0.0
	for _, m := range ms {
		s += f(m)
	}
	return s
}

type sumCount func(relayMetrics) (sum, count float64)

func claimOf(m relayMetrics) (float64, float64) { return m.claimSum, m.claimCount }
func markOf(m relayMetrics) (float64, float64)  { return m.markSum, m.markCount }
func fullOf(m relayMetrics) (float64, float64)  { return m.fullSum, m.fullCount }

// tickSum reads a cumulative sum and count from a tick.
type tickSum func(pressureTick) (sum, count float64)

// ofRelays sums f over the tick's relays.
func ofRelays(f sumCount) tickSum {
	return func(tk pressureTick) (sum, count float64) {
		for _, m := range tk.m {
			s, c := f(m)
			sum, count = sum+s, count+c
		}
		return sum, count
	}
}

// claimBuffersOf and claimServerOf read the incremental claim's figures
// from pg_stat_statements: buffers (hit and read) and execution time (ms).
func claimBuffersOf(tk pressureTick) (float64, float64) {
	return tk.srv.blocks, tk.srv.rows - tk.srv.calls
}
func claimServerOf(tk pressureTick) (float64, float64) { return tk.srv.execMs, tk.srv.calls }

// meanPer is the mean of the sum per count between two ticks.
func meanPer(a, b pressureTick, f tickSum) float64 {
	sa, ca := f(a)
	sb, cb := f(b)
	if cb-ca <= 0 {
		return math.NaN()
	}
	return (sb - sa) / (cb - ca)
}

// meanMs is the mean statement time between two ticks, in ms.
func meanMs(a, b pressureTick, f sumCount) float64 { return 1000 * meanPer(a, b, ofRelays(f)) }

// windowMean is the mean of f per count between from and to: from the last
// tick at or before from to the last tick at or before to.
func windowMean(ticks []pressureTick, from, to time.Time, f tickSum) float64 {
	a, b := -1, -1
	for i, tk := range ticks {
		if !tk.at.After(from) {
			a = i
		}
		if !tk.at.After(to) {
			b = i
		}
	}
	if a < 0 && len(ticks) > 0 {
		a = 0
	}
	if a < 0 || b <= a {
		return math.NaN()
	}
	return meanPer(ticks[a], ticks[b], f)
}

// recoveryWindow is the stretch of commits whose p99 says a recovery is
// back: ten seconds, some 8,000 events at the base rate.
const recoveryWindow = 10 * time.Second

// recoveredIn is how long after start the relay is back: the first second
// t from which the events committed in [t, t+recoveryWindow) have a p99
// within 1.5x the clean phase's (at least 50 of them); -1 when no such
// window fits in the phase. after is the p99 of every event committed from
// t to the phase's end (whether it stayed back; NaN when not back).
//
// An earlier rule asked the p99 of every event from t to the phase's end to
// be back. It judged the machine, not the recovery: the phase's last
// seconds are its fewest events, and one autovacuum of the outbox table
// (every minute, seconds long as the table grows) or a burst of other work
// there kept it "not back". On 7 December 2026 it read 53 s for the recovery
// after the clean phase itself, a control with no fault before it.
func recoveredIn(lats []time.Duration, commits []int64, start, end time.Time, cleanP99 float64) (in time.Duration, after float64) {
	type pair struct {
		c int64
		d time.Duration
	}
	ps := make([]pair, len(lats))
	for i := range lats {
		ps[i] = pair{commits[i], lats[i]}
	}
	slices.SortFunc(ps, func(a, b pair) int { return cmp.Compare(a.c, b.c) })
	at := func(t time.Time) int {
		k, _ := slices.BinarySearchFunc(ps, t.UnixNano(), func(p pair, c int64) int { return cmp.Compare(p.c, c) })
		return k
	}
	p99 := func(ps []pair) float64 {
		ds := make([]time.Duration, len(ps))
		for i, p := range ps {
			ds[i] = p.d
		}
		_, p, _ := percentiles(ds)
		return p
	}
	for t := time.Duration(0); !start.Add(t + recoveryWindow).After(end); t += time.Second {
		from, to := at(start.Add(t)), at(start.Add(t+recoveryWindow))
		if to-from < 50 {
			continue
		}
		if p99(ps[from:to]) <= 1.5*cleanP99 {
			return t, p99(ps[from:])
		}
	}
	return -1, math.NaN()
}

// pressureTable is the run's figures as a Markdown table, one row per
// phase, for BENCHMARKS.md.
func pressureTable(runs []*pressureOutcome, sz pressureSizes, walLevel string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "pressure: %d events/s over %d aggregates, one event per transaction, Notifier; private PostgreSQL 15, defaults (autovacuum on, wal_level=%s); two relays of each kind; latency = commit → first delivery to a consumer of the stream\n\n",
		sz.rate, sz.aggregates, walLevel)
	b.WriteString("| relay | phase | written/s | p50 ms | p99 ms | max ms | > 2 s | backlog max | backlog end | dead rows max | claim ms first → last | /readyz non-200 | republished (after a lease) | expired claims | kills | lost / phantom / out of order / dup | recovered in | server ERRORs | CDC: takeovers / left to the safety net | load |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	num := numStr
	for _, o := range runs {
		for _, st := range o.stats {
			rec := ""
			if st.recovery {
				rec = recoveredString(st.recoveredIn)
				if math.IsNaN(st.cleanP99) {
					rec = "-"
				}
			}
			cdc := ""
			if o.kind == "cdc" {
				cdc = fmt.Sprintf("%d / %.0f", st.takeovers, st.cdcLeft)
			}
			kills := ""
			if st.kills > 0 {
				kills = fmt.Sprint(st.kills)
			}
			fmt.Fprintf(&b, "| %s | %s | %.0f | %s | %s | %s | %d | %d | %d | %d | %s → %s | %d/%d | %d (%d) | %s | %s | %d / %d / %d / %d | %s | %d | %s | %s |\n",
				o.kind, st.name, st.rate, num(st.p50, 1), num(st.p99, 1), num(st.max, 0), st.late2s, st.backlogMax, st.backlogEnd, st.deadMax,
				num(st.claimFirst, 2), num(st.claimLast, 2), st.notReady, st.readySamples, st.republished, st.republishedLease, num(st.expired, 0),
				kills, st.lost, st.phantoms, st.outOfOrder, st.duplicates, rec, st.logErrors, cdc, st.load)
		}
	}
	for _, o := range runs {
		extra := []string{o.totals()}
		if o.drainedIn < 0 {
			extra = append(extra, fmt.Sprintf("%d events never reached the destination within %s of the writers stopping", o.leftOver, sz.drain))
		}
		if o.skipped > 0 {
			extra = append(extra, fmt.Sprintf("the writers fell more than a second behind: %d transactions not offered", o.skipped))
		}
		if o.tapDrops > 0 {
			extra = append(extra, fmt.Sprintf("the wire tap dropped %d messages (republish counts are a lower bound)", o.tapDrops))
		}
		if p := len(o.l.phantoms); p > 0 {
			extra = append(extra, fmt.Sprintf("%d phantom deliveries", p))
		}
		extra = append(extra, o.exits...)
		if errs := o.logErrorKinds(); errs != "" {
			extra = append(extra, "server log: "+errs)
		}
		if len(o.notReady) > 0 {
			var rs []string
			for k, v := range o.notReady {
				rs = append(rs, fmt.Sprintf("%d× %s", v, k))
			}
			sort.Strings(rs)
			extra = append(extra, "/readyz: "+strings.Join(rs, "; "))
		}
		if len(extra) > 0 {
			fmt.Fprintf(&b, "\n%s: %s\n", o.kind, strings.Join(extra, "; "))
		}
	}
	return b.String()
}

// numStr formats v, or "-" when it is NaN (no figure).
func numStr(v float64, prec int) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

var digits = regexp.MustCompile(`[0-9]+`)

// logErrorKinds lists the server log's ERROR messages during the run's
// phases, by kind (numbers replaced), most frequent first.
func (o *pressureOutcome) logErrorKinds() string {
	if len(o.phases) == 0 {
		return ""
	}
	from, to := o.phases[0].logFrom, o.phases[len(o.phases)-1].logTo
	if from > to || to > len(o.serverLog) {
		return ""
	}
	kinds := map[string]int{}
	for _, line := range strings.Split(o.serverLog[from:to], "\n") {
		_, msg, ok := strings.Cut(line, "ERROR:")
		if !ok {
			continue
		}
		kinds[shorten(digits.ReplaceAllString(strings.TrimSpace(msg), "N"), 100)]++
	}
	return killedString(kinds)
}

// totals describes the whole run of one relay kind: what the relays counted
// from the first sample to the last (drain included), and the drain.
func (o *pressureOutcome) totals() string {
	if len(o.ticks) == 0 {
		return "no samples"
	}
	first, last := o.ticks[0], o.ticks[len(o.ticks)-1]
	d := func(f func(relayMetrics) float64) float64 { return sumM(last.m, f) - sumM(first.m, f) }
	rep := map[int32]bool{}
	for _, r := range o.l.republ {
		rep[r.ix] = true
	}
	drained := "drained in " + o.drainedIn.Round(100*time.Millisecond).String()
	if o.drainedIn < 0 {
		drained = fmt.Sprintf("%d never arrived", o.leftOver)
	}
	return fmt.Sprintf("whole run: relays counted %s expired claims and %s lease conflicts, %d events republished; after the writers stopped the backlog %s",
		numStr(d(func(m relayMetrics) float64 { return m.expired }), 0), numStr(d(func(m relayMetrics) float64 { return m.conflicts }), 0), len(rep), drained)
}

// pressureResults turns the runs into the bench's results, with the targets
// of issues 24 and 27 beside the figures.
func pressureResults(runs []*pressureOutcome, sz pressureSizes, walLevel string) []Result {
	var out []Result
	var pollingClean *phaseStats
	for _, o := range runs {
		if o.kind == "polling" {
			for i := range o.stats {
				if o.stats[i].name == "clean" {
					pollingClean = &o.stats[i]
				}
			}
		}
	}
	for _, o := range runs {
		out = append(out, Result{Scenario: "pressure/" + o.kind + "/run", Value: f(float64(o.leftOver)), Unit: "never arrived",
			Target: "0", Met: b(o.leftOver == 0), Note: o.totals()})
		// Phantoms are counted once per run: an unknown id has no phase.
		phantoms := len(o.l.phantoms)
		for i := range o.stats {
			st := o.stats[i]
			base := "pressure/" + o.kind + "/" + st.name
			cellRate := float64(st.offered)
			main := Result{Scenario: base, EventsPerSec: f(st.rate), P50: f(st.p50), P99: f(st.p99), Max: f(st.max),
				Value: f(float64(st.backlogMax)), Unit: "backlog max", Events: int64(st.committed), Seconds: st.dur.Seconds(),
				Series: st.backlogSeries, Note: st.note(o.kind, walLevel)}
			clean3 := 3 * st.cleanP99
			switch {
			case st.recovery:
				if !math.IsNaN(st.cleanP99) && st.cell != "clean" {
					ok := st.recoveredIn >= 0 && st.recoveredIn <= 30*time.Second
					main.Target = fmt.Sprintf("back to clean p99 (x1.5 = %.0f ms) within 30 s", 1.5*st.cleanP99)
					main.Met = b(ok)
				}
			case st.cell == "clean" && o.kind == "cdc" && pollingClean != nil:
				main.Target = fmt.Sprintf("p99 <= polling's %.1f ms, max <= 1000 ms", pollingClean.p99)
				main.Met = b(st.p99 <= pollingClean.p99 && st.max <= 1000)
			case st.cell == "xmin" && !math.IsNaN(clean3):
				main.Target = fmt.Sprintf("p99 <= 3x clean (%.0f ms)", clean3)
				main.Met = b(st.p99 <= clean3)
			case st.cell == "kill-busy" || st.cell == "kill-idle":
				main.Target = "max <= 2000 ms (no event delayed > 2 s by a kill)"
				main.Met = b(st.max <= 2000)
			}
			out = append(out, main)
			if st.recovery {
				continue
			}
			// Checks over the cell and its recovery.
			rec := st
			if i+1 < len(o.stats) {
				rec = o.stats[i+1]
			}
			lost, ooo, dups := st.lost+rec.lost, st.outOfOrder+rec.outOfOrder, st.duplicates+rec.duplicates
			ph := 0
			if i == 0 {
				ph = phantoms
			}
			chk := Result{Scenario: base + "/checks", Value: f(float64(lost + ph + ooo)), Unit: "violations",
				Target: "0 lost, 0 phantom, 0 out of order", Met: b(lost+ph+ooo == 0),
				Note: fmt.Sprintf("cell and recovery: %d lost, %d out of order, %d duplicate deliveries at the consumer; %d phantoms in the whole %s run (reported on its first cell)",
					lost, ooo, dups, phantoms, o.kind)}
			if o.kind == "naive" {
				chk.Note += "; the naive relay does not keep order by design"
			}
			out = append(out, chk)
			switch st.cell {
			case "xmin":
				out = append(out,
					Result{Scenario: base + "/backlog", Value: f(float64(st.backlogMax)), Unit: "events max",
						Target: fmt.Sprintf("<= 1 s of traffic (%d)", st.offered), Met: b(float64(st.backlogMax) <= cellRate)},
					Result{Scenario: base + "/claim-last-vs-first", Ratio: f(st.claimLast / st.claimFirst), RatioOf: "its first window",
						Target: "<= 1.5", Met: metIf(st.claimLast/st.claimFirst, 1.5),
						Note: fmt.Sprintf("mean claim %.2f ms in the first %s, %.2f ms in the last (the relays' outbox_db_statement_seconds{statement=\"claim\"})",
							st.claimFirst, st.claimWindow, st.claimLast)},
					Result{Scenario: base + "/claim-buffers-last-vs-first", Ratio: f(st.claimBufLast / st.claimBufFirst), RatioOf: "its first window",
						Note: fmt.Sprintf("buffers (hit or read) of the incremental claims per event claimed, pg_stat_statements: %.1f in the first %s, %.1f in the last; the server's execution %.2f ms → %.2f ms per claim",
							st.claimBufFirst, st.claimWindow, st.claimBufLast, st.claimSrvFirst, st.claimSrvLast)},
					Result{Scenario: base + "/dead-rows", Value: f(float64(st.deadMax)), Unit: "n_dead_tup max",
						Note: fmt.Sprintf("outbox_events, pg_stat_user_tables; %d at the end of the cell", st.deadEnd)})
				if o.kind == "cdc" {
					out = append(out, Result{Scenario: base + "/takeovers", Value: f(float64(st.takeovers + st.replTimeouts)), Unit: "events",
						Target: "0 replication timeouts, 0 takeovers", Met: b(st.takeovers == 0 && st.replTimeouts == 0),
						Note: fmt.Sprintf("%d takeovers, %d replication timeouts in the server log, %d s with no relay streaming", st.takeovers, st.replTimeouts, st.noStreamer)})
				}
			case "takeover":
				out = append(out, st.takeover.result(base))
			case "readers", "load", "pool":
				out = append(out, Result{Scenario: base + "/backlog-end", Value: f(float64(st.backlogEnd)), Unit: "events",
					Target: fmt.Sprintf("keeps up: <= 1 s of traffic (%d) at the end", st.offered), Met: b(float64(st.backlogEnd) <= cellRate)})
			case "kill-busy", "kill-idle":
				out = append(out,
					Result{Scenario: base + "/republished", Value: f(float64(st.republished)), Unit: "events",
						Target: "0 republished because of a kill", Met: b(st.republished == 0),
						Note: fmt.Sprintf("events published more than once (seen on the wire; JetStream's duplicate window hides them from consumers), %d of them 2/3 of a lease or more after the first", st.republishedLease)},
					Result{Scenario: base + "/readyz-non-200", Value: f(float64(st.notReady)), Unit: "samples",
						Target: "0 (200 throughout isolated kills)", Met: b(st.notReady == 0),
						Note: fmt.Sprintf("of %d samples (each relay once a second); %d kills", st.readySamples, st.kills)})
			case "clean":
				if o.kind == "cdc" {
					out = append(out, Result{Scenario: base + "/server-log-errors", Value: f(float64(st.logErrors)), Unit: "lines",
						Target: "0 (a quiet standby)", Met: b(st.logErrors == 0)})
					if pollingClean != nil {
						r := st.rate / pollingClean.rate
						out = append(out, Result{Scenario: base + "/writers-vs-polling", Ratio: f(r), RatioOf: "pressure/polling/clean",
							Target: ">= 0.95", Met: b(r >= 0.95), Note: "writers' committed events/s at the same offered rate"})
					}
				}
			}
		}
	}
	return out
}

// metIf is b(v <= limit), or nil when v is NaN (no figure: no verdict).
func metIf(v, limit float64) *bool {
	if math.IsNaN(v) {
		return nil
	}
	return b(v <= limit)
}

// note describes the phase for the results' Note.
func (st phaseStats) note(kind, walLevel string) string {
	var parts []string
	if st.recovery {
		parts = append(parts, fmt.Sprintf("recovery after %s at the base rate", st.cell))
	} else {
		parts = append(parts, st.cell+": "+cellDescriptions[st.cell])
	}
	parts = append(parts, fmt.Sprintf("offered %d/s, committed %d (and %d rolled back on purpose, beside them)", st.offered, st.committed, st.rolledBack))
	parts = append(parts, fmt.Sprintf("%d events > 2 s", st.late2s))
	parts = append(parts, fmt.Sprintf("backlog end %d", st.backlogEnd))
	if st.pendingMax >= 0 {
		parts = append(parts, fmt.Sprintf("pending rows max %d (count(*) once a second)", st.pendingMax))
	}
	parts = append(parts, fmt.Sprintf("dead rows max %d, %d autovacuums", st.deadMax, st.autovacuums))
	if !math.IsNaN(st.claimMean) {
		parts = append(parts, fmt.Sprintf("claim %.2f ms mean (%.2f first, %.2f last %s), mark %.2f ms, %.0f background full scans (%.0f ms mean)", st.claimMean, st.claimFirst, st.claimLast, st.claimWindow, st.markMean, st.fullScans, st.fullMean))
		if !math.IsNaN(st.claimBufFirst) {
			parts = append(parts, fmt.Sprintf("incremental claims in pg_stat_statements: %.1f → %.1f buffers per event claimed, %.2f → %.2f ms per claim on the server (first → last %s)",
				st.claimBufFirst, st.claimBufLast, st.claimSrvFirst, st.claimSrvLast, st.claimWindow))
		}
	}
	parts = append(parts, fmt.Sprintf("/readyz non-200 %d of %d", st.notReady, st.readySamples))
	parts = append(parts, fmt.Sprintf("republished %d (%d after a lease), expired claims %s, lease conflicts %s", st.republished, st.republishedLease, numStr(st.expired, 0), numStr(st.conflicts, 0)))
	if kind == "cdc" {
		parts = append(parts, fmt.Sprintf("takeovers %d, %d s with no streamer, %.0f left to the safety net, replication timeouts %d", st.takeovers, st.noStreamer, st.cdcLeft, st.replTimeouts))
	}
	if st.kills > 0 {
		parts = append(parts, fmt.Sprintf("%d kills (%s)", st.kills, killedString(st.killed)))
	}
	if st.held > 0 {
		parts = append(parts, fmt.Sprintf("%d connections held", st.held))
	}
	if st.readerLoops > 0 {
		parts = append(parts, fmt.Sprintf("%d reader snapshots", st.readerLoops))
	}
	if st.logErrors > 0 {
		parts = append(parts, fmt.Sprintf("server log ERROR lines %d", st.logErrors))
	}
	if st.writerErrs > 0 {
		parts = append(parts, fmt.Sprintf("writer errors %d (%s)", st.writerErrs, st.firstWriterErr))
	}
	parts = append(parts, "wal_level="+walLevel, "load average "+st.load+" at the end (2 cores, shared)")
	return strings.Join(parts, "; ")
}
