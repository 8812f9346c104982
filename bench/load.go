package main

import (
	"context"
	"sync"
	"time"

	"github.com/pgoutbox/outbox"
)

// startRelay runs an in-process relay on the space, publishing to its NATS
// stream over a connection of its own, from a relay pool of 4 connections
// (the session settings of "outbox relay"). cfg's Schema, Publisher and
// Logger are filled in; wrap, when set, wraps the NATS publisher (to record
// acks). stop ends the relay, waits for it and closes its pool and
// connection; it returns the relay's error.
func startRelay(ctx context.Context, e *env, s space, cfg outbox.RelayConfig, wrap func(outbox.Publisher) outbox.Publisher) (r *outbox.Relay, stop func() error, err error) {
	pub, nc, err := e.publisher(ctx, s)
	if err != nil {
		return nil, nil, err
	}
	return startRelayTo(ctx, e, s, pub, nc.Close, cfg, wrap)
}

// startRelayTo is startRelay publishing through pub (any destination);
// closePub runs when the relay stops, or when it cannot start.
func startRelayTo(ctx context.Context, e *env, s space, pub outbox.Publisher, closePub func(), cfg outbox.RelayConfig,
	wrap func(outbox.Publisher) outbox.Publisher) (r *outbox.Relay, stop func() error, err error) {
	pool, err := e.relayPool(ctx, 4)
	if err != nil {
		closePub()
		return nil, nil, err
	}
	cfg.Schema, cfg.Publisher = s.schema, pub
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	if wrap != nil {
		cfg.Publisher = wrap(pub)
	}
	r, err = outbox.NewRelay(pool, cfg)
	if err != nil {
		closePub()
		pool.Close()
		return nil, nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	return r, func() error {
		cancel()
		err := <-done
		closePub()
		pool.Close()
		return err
	}, nil
}

// offerLoad calls do rate times a second for d, from workers goroutines, as
// an open loop: the calls are due by the clock, not after the previous one
// finished, so a slow database shows as latency and a lower achieved rate,
// not as a lower offered rate. It returns how many calls it offered, how
// long it took, and the first error a call returned (the others go on).
func offerLoad(ctx context.Context, rate int, d time.Duration, workers int, do func() error) (sent int, elapsed time.Duration, err error) {
	ticks := make(chan struct{}, rate)
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range ticks {
				if err := do(); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	start := time.Now()
	for time.Since(start) < d && ctx.Err() == nil {
		due := int(time.Since(start).Seconds() * float64(rate))
		for ; sent < due; sent++ {
			ticks <- struct{}{}
		}
		time.Sleep(500 * time.Microsecond)
	}
	close(ticks)
	wg.Wait()
	return sent, time.Since(start), firstErr
}
