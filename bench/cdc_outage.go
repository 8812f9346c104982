package main

import (
	"context"
	"fmt"
	"time"

	"github.com/pgoutbox/outbox/outboxcdc"
)

// benchCDCOutage is the "cdc-outage" group (only when named; --outage long,
// 5 minutes by default): on the CDC groups' private cluster, writers commit
// orders (one OrderCreated event per transaction, 16 clients) into two
// spaces at once while no relay runs, each at the rate that writes the
// backlog (--backlog, default 200,000) in the outage; one space has a CDC
// slot. Then the CDC relay drains its space from the slot, and the polling
// relay drains the other, one after the other. It reports the WAL the slot
// retained per minute of outage and both drain rates.
func benchCDCOutage(ctx context.Context, e *env) ([]Result, error) {
	pe, closeCluster, err := cdcCluster(ctx, e)
	if err != nil {
		return nil, err
	}
	defer closeCluster()
	outage, n := e.sz.outage, e.sz.backlog
	rate := max(1, int(float64(n)/outage.Seconds()))

	cs, cleanupC, err := pe.newSpace(ctx, "cdc-outage")
	if err != nil {
		return nil, err
	}
	defer cleanupC()
	ps, cleanupP, err := pe.newSpace(ctx, "cdc-outage-polling")
	if err != nil {
		return nil, err
	}
	defer cleanupP()
	slot := outboxcdc.SlotName(cs.schema, outboxcdc.GroupDefault)
	if err := outboxcdc.Setup(ctx, outboxcdc.Config{Pool: pe.admin, Schema: cs.schema}); err != nil {
		return nil, err
	}
	defer func() {
		_, _ = pe.admin.Exec(context.WithoutCancel(ctx), "SELECT pg_drop_replication_slot($1)", slot)
	}()
	var counts [2]int
	errs := make(chan error, 2)
	e.logf("cdc-outage: no relay for %s; writers commit %d events/s into each of two spaces", outage, rate)
	for i, s := range []space{cs, ps} {
		go func(i int, s space) {
			load, err := newOrderLoad(ctx, pe, s)
			if err != nil {
				errs <- err
				return
			}
			defer load.Close()
			commits, _, _, err := load.offerAt(ctx, rate, outage, nil)
			counts[i] = len(commits)
			errs <- err
		}(i, s)
	}
	for range 2 {
		if err := <-errs; err != nil {
			return nil, err
		}
	}
	var retained int64
	if err := pe.admin.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&retained); err != nil {
		return nil, err
	}
	perMin := float64(retained) / 1e6 / outage.Minutes()
	e.logf("cdc-outage: %d and %d events written; the slot retained %.0f MB (%.1f MB per minute of outage, both spaces' writes)",
		counts[0], counts[1], float64(retained)/1e6, perMin)
	out := []Result{{Scenario: "cdc-outage/wal-retained-per-minute", Value: f(perMin),
		Note: fmt.Sprintf("MB of WAL the slot held after a %s outage with %d events/s written into the slot's space and as many into another (%.0f bytes per event written)",
			outage, rate, float64(retained)/float64(counts[0]+counts[1]))}}

	cdcDur, err := drainCDC(ctx, pe, cs, counts[0], "cdc-outage/drain/cdc")
	if err != nil {
		return out, err
	}
	pollDur, _, err := drainOurs(ctx, pe, ps, counts[1], nil)
	if err != nil {
		return out, err
	}
	cdcRate, pollRate := float64(counts[0])/cdcDur.Seconds(), float64(counts[1])/pollDur.Seconds()
	e.logf("cdc-outage/drain: cdc %.0f events/s (%s), polling %.0f events/s (%s)", cdcRate, cdcDur.Round(time.Millisecond), pollRate, pollDur.Round(time.Millisecond))
	note := fmt.Sprintf("the %d events written during a %s outage, one aggregate each", counts[0], outage)
	return append(out,
		Result{Scenario: "cdc-outage/drain/cdc", EventsPerSec: f(cdcRate), Events: int64(counts[0]), Seconds: cdcDur.Seconds(),
			Ratio: f(cdcRate / pollRate), RatioOf: "cdc-outage/drain/polling", Note: note + ", read from the slot by the CDC stream alone"},
		Result{Scenario: "cdc-outage/drain/polling", EventsPerSec: f(pollRate), Events: int64(counts[1]), Seconds: pollDur.Seconds(),
			Note: note + ", drained by the polling relay"}), nil
}
