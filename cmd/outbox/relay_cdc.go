package main

// `outbox relay --mode`: polling (the default), cdc (stream the outbox
// table's inserts from a logical replication slot, with a polling safety net
// in the same process) or reconcile (only the safety net: publish what has
// been pending longer than --reconcile-after).

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/outboxcdc"
)

// Relay modes.
const (
	modePolling   = "polling"
	modeCDC       = "cdc"
	modeReconcile = "reconcile"
)

// reconcileAfterDefault is --reconcile-after's default: far above the CDC
// path's normal latency, short enough that a lost slot's gap is published
// soon.
const reconcileAfterDefault = 10 * time.Second

// relayModeFlags are the flags choosing how the relay finds events.
type relayModeFlags struct {
	mode           string
	reconcileAfter cli.Duration
	group          string
	slot           string
	publication    string
	metrics        *cdcCollector // with --metrics-addr in cdc and reconcile modes
	cdc            atomic.Pointer[outboxcdc.Relay]
}

// ready wraps the relay's readiness: in cdc mode the CDC stream must also
// be streaming or standing by.
func (m *relayModeFlags) ready(base func() error) func() error {
	if m.mode != modeCDC {
		return base
	}
	return func() error {
		if err := base(); err != nil {
			return err
		}
		if c := m.cdc.Load(); c != nil {
			return c.Ready()
		}
		return errors.New("cdc relay starting")
	}
}

func (m *relayModeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&m.mode, "mode", cli.Env("OUTBOX_RELAY_MODE", modePolling),
		"how events are found (env OUTBOX_RELAY_MODE): polling (claim from the table), cdc (read committed inserts from a logical replication slot, needs wal_level=logical; a polling safety net runs beside it with --reconcile-after), or reconcile (only that safety net, beside cdc relays elsewhere)")
	m.reconcileAfter.D = reconcileAfterDefault
	if v := cli.Env("OUTBOX_RECONCILE_AFTER", ""); v != "" {
		if d, err := cli.ParseDuration(v); err == nil && d > 0 {
			m.reconcileAfter.D = d
		}
	}
	fs.Var(&m.reconcileAfter, "reconcile-after",
		"in cdc and reconcile modes, the polling path claims only events written at least this long ago; when idle it looks every quarter of it (at least --poll-interval) and scans every pending event at most every 6 times it (env OUTBOX_RECONCILE_AFTER)")
	fs.StringVar(&m.group, "cdc-group", cli.Env("OUTBOX_CDC_GROUP", outboxcdc.GroupDefault),
		"cdc mode: relay group; the relays of a group share one replication slot, one streams and the others stand by (env OUTBOX_CDC_GROUP)")
	fs.StringVar(&m.slot, "cdc-slot", cli.Env("OUTBOX_CDC_SLOT", ""),
		"cdc mode: replication slot name (env OUTBOX_CDC_SLOT; default outbox_<schema>_<group>)")
	fs.StringVar(&m.publication, "cdc-publication", cli.Env("OUTBOX_CDC_PUBLICATION", ""),
		"cdc mode: publication name (env OUTBOX_CDC_PUBLICATION; default outbox_<schema>_events)")
}

// check validates the mode flags.
func (m *relayModeFlags) check(fs *flag.FlagSet) error {
	switch m.mode {
	case modePolling, modeCDC, modeReconcile:
	default:
		return cli.Usagef(fs, "--mode %q: want polling, cdc or reconcile", m.mode)
	}
	if m.mode != modePolling && m.reconcileAfter.D <= 0 {
		return cli.Usagef(fs, "--reconcile-after must be positive in %s mode", m.mode)
	}
	return nil
}

// apply sets the polling relay's configuration for the mode: in cdc and
// reconcile modes it is the safety net.
func (m *relayModeFlags) apply(cfg *outbox.RelayConfig) {
	if m.mode != modePolling {
		cfg.ReconcileAfter = m.reconcileAfter.D
	}
}

// runCDC streams the slot and runs safetyNet (the polling relay, with
// ReconcileAfter set) beside it, until ctx ends. The CDC path publishes
// through a relay of its own (ID <id>-cdc), with cfg's publisher and
// settings.
func (m *relayModeFlags) runCDC(ctx context.Context, pool *pgxpool.Pool, databaseURL string, cfg outbox.RelayConfig, safetyNet *outbox.Relay) error {
	cdcCfg := cfg
	cdcCfg.ID = safetyNet.ID() + "-cdc"
	cdcCfg.ReconcileAfter = 0
	cdcCfg.DisableNotify = true
	cdcCfg.Cleanup = outbox.CleanupConfig{}
	cdcRelay, err := outbox.NewRelay(pool, cdcCfg)
	if err != nil {
		return err
	}
	c, err := outboxcdc.New(outboxcdc.Config{
		DatabaseURL: databaseURL, Pool: pool, Schema: cfg.Schema, Group: m.group, Slot: m.slot, Publication: m.publication,
		Relay: cdcRelay, SafetyNet: safetyNet, BatchSize: cfg.BatchSize, Logger: cfg.Logger,
	})
	if err != nil {
		return err
	}
	if m.metrics != nil {
		m.metrics.relay.Store(c)
	}
	m.cdc.Store(c)
	cfg.Logger.Info("relay mode cdc", slog.Duration("reconcile_after", m.reconcileAfter.D))
	return c.Run(ctx)
}
