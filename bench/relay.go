package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxnats"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// drainOurs drains the space's backlog of n events with one in-process relay
// (default configuration) and returns the elapsed time, from Run to the last
// mark.
func drainOurs(ctx context.Context, e *env, s space, n int, tweak func(*outbox.RelayConfig)) (time.Duration, *outbox.Relay, error) {
	pub, nc, err := e.publisher(ctx, s)
	if err != nil {
		return 0, nil, err
	}
	defer nc.Close()
	return drainOursTo(ctx, e, s, pub, n, tweak)
}

// drainOursTo is drainOurs publishing through pub (any destination).
func drainOursTo(ctx context.Context, e *env, s space, pub outbox.Publisher, n int, tweak func(*outbox.RelayConfig)) (time.Duration, *outbox.Relay, error) {
	pool, err := e.relayPool(ctx, 4)
	if err != nil {
		return 0, nil, err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return 0, nil, err
	}
	ph := &phases{}
	cfg := outbox.RelayConfig{Schema: s.schema, Publisher: pub, Logger: quietLogger(), Observer: ph}
	if tweak != nil {
		tweak(&cfg)
	}
	r, err := outbox.NewRelay(pool, cfg)
	if err != nil {
		return 0, nil, err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- r.Run(runCtx) }()
	limit := time.Now().Add(10 * time.Minute)
	for r.Stats().Published < int64(n) {
		if time.Now().After(limit) || ctx.Err() != nil {
			stop()
			<-done
			return 0, r, fmt.Errorf("relay published %d of %d", r.Stats().Published, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
	elapsed := time.Since(start)
	stop()
	if err := <-done; err != nil {
		return 0, r, err
	}
	e.logf("%s: %s", s.schema, ph.String(elapsed))
	return elapsed, r, nil
}

// naiveRelay is the machine's limit: no ordering at all. It claims the 1,000
// oldest pending rows (SKIP LOCKED, a lease), publishes them all
// asynchronously with their event id as Nats-Msg-Id and the same headers
// outboxnats sends, waits for every ack, marks them published, repeats.
func naiveRelay(ctx context.Context, e *env, s space, n int) (time.Duration, error) {
	return naiveWorkers(ctx, e, s, n, 1)
}

// naiveWorkers runs workers copies of the naive relay's loop side by side
// (SKIP LOCKED keeps their claims apart) until n events are marked.
func naiveWorkers(ctx context.Context, e *env, s space, n, workers int) (time.Duration, error) {
	pool, err := e.relayPool(ctx, int32(2*workers+2))
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	// Create the stream the same way as for our relay.
	if _, nc, err := e.publisher(ctx, s); err != nil {
		return 0, err
	} else {
		nc.Close()
	}
	events := s.schema + ".outbox_events"
	claim := `UPDATE ` + events + ` e SET claimed_by = 'naive', claim_until = now() + interval '30 seconds'
WHERE e.event_id IN (SELECT event_id FROM ` + events + `
	WHERE published_at IS NULL AND (claim_until IS NULL OR claim_until < now())
	ORDER BY available_at, occurred_at LIMIT 1000 FOR UPDATE SKIP LOCKED)
RETURNING e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.event_type, e.schema_version, e.payload, e.occurred_at`
	mark := `UPDATE ` + events + ` SET published_at = now(), claimed_by = NULL, claim_until = NULL WHERE event_id = ANY($1)`
	var mu sync.Mutex
	done := 0
	var claimT, pubT, markT time.Duration
	worker := func() error {
		nc, err := nats.Connect(e.o.natsURL, nats.Name("outbox-bench-naive"))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
		if err != nil {
			return err
		}
		for {
			mu.Lock()
			finished := done >= n
			mu.Unlock()
			if finished {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			t0 := time.Now()
			rows, err := pool.Query(ctx, claim)
			if err != nil {
				return err
			}
			var ids [][16]byte // raw 16-byte ids: cheaper to encode than uuid.UUID's strings
			var futures []jetstream.PubAckFuture
			for rows.Next() {
				var m outbox.Message
				if err := rows.Scan(&m.ID, &m.AggregateType, &m.AggregateID, &m.Sequence, &m.Type, &m.SchemaVersion, &m.Payload, &m.OccurredAt); err != nil {
					rows.Close()
					return err
				}
				ids = append(ids, m.ID)
				paf, err := js.PublishMsgAsync(naiveMsg(s.prefix, &m))
				if err != nil {
					rows.Close()
					return err
				}
				futures = append(futures, paf)
			}
			if err := rows.Err(); err != nil {
				return err
			}
			if len(ids) == 0 {
				time.Sleep(time.Millisecond) // the others hold the rest
				continue
			}
			t1 := time.Now()
			for _, paf := range futures {
				select {
				case <-paf.Ok():
				case err := <-paf.Err():
					return err
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			t2 := time.Now()
			if _, err := pool.Exec(ctx, mark, ids); err != nil {
				return err
			}
			mu.Lock()
			done += len(ids)
			claimT += t1.Sub(t0) // includes sending the messages (async, as rows arrive)
			pubT += t2.Sub(t1)
			markT += time.Since(t2)
			mu.Unlock()
		}
	}
	start := time.Now()
	var g errgroup.Group
	for w := 0; w < workers; w++ {
		g.Go(worker)
	}
	err = g.Wait()
	elapsed := time.Since(start)
	per := func(d time.Duration) float64 { return ms(d) / float64(max(done, 1)) * 1000 }
	e.logf("%s: naive (%d workers): claims %.2f ms, publish %.2f ms, marks %.2f ms per 1000 events (summed over workers)",
		s.schema, workers, per(claimT), per(pubT), per(markT))
	return elapsed, err
}

// naiveMsg carries the same subject, headers and data as outboxnats would.
func naiveMsg(prefix string, m *outbox.Message) *nats.Msg {
	id := m.ID.String()
	h := nats.Header{}
	h.Set(outboxnats.HeaderSpecVersion, outboxnats.SpecVersion)
	h.Set(outboxnats.HeaderID, id)
	h.Set(outboxnats.HeaderType, m.Type)
	h.Set(outboxnats.HeaderSource, outboxnats.SourceDefault)
	h.Set(outboxnats.HeaderSubject, m.AggregateID)
	h.Set(outboxnats.HeaderTime, m.OccurredAt.UTC().Format(time.RFC3339Nano))
	h.Set(outboxnats.HeaderAggregateType, m.AggregateType)
	h.Set(outboxnats.HeaderSequence, outbox.SequenceHeader(m.Sequence))
	h.Set(outboxnats.HeaderSchemaVersion, fmt.Sprint(m.SchemaVersion))
	h.Set(outboxnats.HeaderPartitionKey, m.AggregateID)
	h.Set(outboxnats.HeaderContentType, outboxnats.ContentType)
	h.Set(outboxnats.HeaderMsgID, id)
	return &nats.Msg{Subject: outboxnats.Subject(prefix, m.AggregateType, m.AggregateID), Header: h, Data: m.Payload}
}

// benchRelay drains the same backlog with our relay, the naive relay and
// Watermill's forwarder (every configuration of wmVariants), in the order
// ours, naive, Watermill, naive, ours: the two drains of ours and of the
// naive relay bracket Watermill's, so that load from elsewhere on a shared
// machine weighs on all of them alike. Then two naive workers, and the hot
// aggregates.
func benchRelay(ctx context.Context, e *env) ([]Result, error) {
	n, aggs := e.sz.backlog, e.sz.aggregates
	var out []Result

	var oursTime, naiveTime time.Duration
	var distinct int
	var stats outbox.RelayStats
	variants := wmVariants
	if e.sz.watermill != nil {
		variants = slices.DeleteFunc(slices.Clone(wmVariants), func(v wmVariant) bool { return !slices.Contains(e.sz.watermill, v.scenario) })
	}
	var wm []wmResult // by variants' index
	var oursRounds []float64
	for round, order := range [][]string{{"ours", "naive", "watermill"}, {"naive", "ours"}} {
		for _, kind := range order {
			if kind == "watermill" {
				if e.o.skipPeer {
					continue
				}
				for _, v := range variants {
					r, err := benchWatermill(ctx, e, n, aggs, v)
					if err != nil {
						return nil, fmt.Errorf("watermill %s: %w", v.scenario, err)
					}
					wm = append(wm, r)
				}
				continue
			}
			s, cleanup, err := e.newSpace(ctx, fmt.Sprintf("relay-%s-%d", kind, round))
			if err != nil {
				return nil, err
			}
			if err := e.loadBacklog(ctx, s.schema, n, aggs, "o-", 1<<40, false); err != nil {
				cleanup()
				return nil, err
			}
			var elapsed time.Duration
			if kind == "ours" {
				var r *outbox.Relay
				elapsed, r, err = drainOurs(ctx, e, s, n, nil)
				if err == nil {
					stats = r.Stats()
					distinct, err = e.checkOrder(ctx, s.stream)
				}
				oursTime += elapsed
			} else {
				elapsed, err = naiveRelay(ctx, e, s, n)
				naiveTime += elapsed
			}
			cleanup()
			if err != nil {
				return nil, fmt.Errorf("%s relay: %w", kind, err)
			}
			e.logf("relay/%s round %d: %.0f events/s (%s)", kind, round+1, float64(n)/elapsed.Seconds(), elapsed.Round(time.Millisecond))
			if kind == "ours" {
				oursRounds = append(oursRounds, float64(n)/elapsed.Seconds())
			}
		}
	}
	ours := float64(2*n) / oursTime.Seconds()
	naive := float64(2*n) / naiveTime.Seconds()
	// The machine's capacity: the naive relay with two workers.
	s2, cleanup2, err := e.newSpace(ctx, "relay-naive2")
	if err != nil {
		return nil, err
	}
	if err := e.loadBacklog(ctx, s2.schema, n, aggs, "o-", 1<<40, false); err != nil {
		cleanup2()
		return nil, err
	}
	naive2Time, err := naiveWorkers(ctx, e, s2, n, 2)
	cleanup2()
	if err != nil {
		return nil, fmt.Errorf("naive relay, 2 workers: %w", err)
	}
	naive2 := float64(n) / naive2Time.Seconds()
	e.logf("relay/naive 2 workers: %.0f events/s", naive2)
	e.logf("relay/ours: %.0f events/s, naive %.0f events/s; I5 holds over %d events, stats %+v", ours, naive, distinct, stats)
	oursRes := Result{Scenario: "relay/ours", EventsPerSec: f(ours), Events: int64(2 * n), Seconds: oursTime.Seconds(),
		Note: fmt.Sprintf("per-aggregate order; two drains of %d events over %d aggregates (%.0f and %.0f events/s); I5 checked on the stream (%d events)",
			n, aggs, oursRounds[0], oursRounds[1], distinct)}
	oursS, naiveS := sample{int64(2 * n), oursTime.Seconds()}, sample{int64(2 * n), naiveTime.Seconds()}
	oursRes.compare(e.o.quick, ours/naive, "relay/naive-unordered", oursS, naiveS)
	if oursRes.Ratio != nil {
		oursRes.Target, oursRes.Met = ">= 0.80", b(ours/naive >= 0.8)
	}

	// Hot aggregates: a quarter of the backlog over 10 aggregates, so each
	// lane holds thousands of events: the claim must take each lane's
	// contiguous successors, or it gets 10 events per round trip.
	hotN := n / 4
	s, cleanup, err := e.newSpace(ctx, "relay-hot")
	if err != nil {
		return nil, err
	}
	if err := e.loadBacklog(ctx, s.schema, hotN, 10, "o-", 1<<40, false); err != nil {
		cleanup()
		return nil, err
	}
	hotElapsed, _, err := drainOurs(ctx, e, s, hotN, nil)
	if err == nil {
		_, err = e.checkOrder(ctx, s.stream)
	}
	cleanup()
	if err != nil {
		return nil, fmt.Errorf("hot aggregates: %w", err)
	}
	s, cleanup, err = e.newSpace(ctx, "relay-hot-naive")
	if err != nil {
		return nil, err
	}
	if err := e.loadBacklog(ctx, s.schema, hotN, 10, "o-", 1<<40, false); err != nil {
		cleanup()
		return nil, err
	}
	hotNaiveElapsed, err := naiveRelay(ctx, e, s, hotN)
	cleanup()
	if err != nil {
		return nil, fmt.Errorf("hot aggregates, naive: %w", err)
	}
	hot, hotNaive := float64(hotN)/hotElapsed.Seconds(), float64(hotN)/hotNaiveElapsed.Seconds()
	e.logf("relay/hot: ours %.0f events/s, naive %.0f events/s", hot, hotNaive)
	hotRes := Result{Scenario: "relay/ours-10-hot-aggregates", EventsPerSec: f(hot),
		Events: int64(hotN), Seconds: hotElapsed.Seconds(), Note: fmt.Sprintf("%d events over 10 aggregates; I5 checked on the stream", hotN)}
	hotRes.compare(e.o.quick, hot/hotNaive, "relay/naive-10-hot-aggregates", sample{int64(hotN), hotElapsed.Seconds()}, sample{int64(hotN), hotNaiveElapsed.Seconds()})
	hotResults := []Result{hotRes,
		{Scenario: "relay/naive-10-hot-aggregates", EventsPerSec: f(hotNaive), Events: int64(hotN), Seconds: hotNaiveElapsed.Seconds()}}

	if e.o.tuneBatch {
		for _, bs := range []int{250, 500, 1000, 2000} {
			s, cleanup, err := e.newSpace(ctx, fmt.Sprintf("relay-batch-%d", bs))
			if err != nil {
				return nil, err
			}
			if err := e.loadBacklog(ctx, s.schema, n, aggs, "o-", 1<<40, false); err != nil {
				cleanup()
				return nil, err
			}
			elapsed, _, err := drainOurs(ctx, e, s, n, func(c *outbox.RelayConfig) { c.BatchSize = bs })
			cleanup()
			if err != nil {
				return nil, err
			}
			rate := float64(n) / elapsed.Seconds()
			e.logf("relay/ours batch %d: %.0f events/s", bs, rate)
			r := Result{Scenario: fmt.Sprintf("relay/ours-batch-%d", bs), EventsPerSec: f(rate), Events: int64(n), Seconds: elapsed.Seconds()}
			r.compare(e.o.quick, rate/naive, "relay/naive-unordered", sample{int64(n), elapsed.Seconds()}, naiveS)
			out = append(out, r)
		}
	}
	naive2Res := Result{Scenario: "relay/naive-unordered-2-workers", EventsPerSec: f(naive2),
		Events: int64(n), Seconds: naive2Time.Seconds(), Note: "the machine's capacity for draining: two naive workers on one table"}
	naive2Res.compare(e.o.quick, naive2/naive, "relay/naive-unordered", sample{int64(n), naive2Time.Seconds()}, naiveS)
	out = append(out, oursRes,
		Result{Scenario: "relay/naive-unordered", EventsPerSec: f(naive), Events: int64(2 * n), Seconds: naiveTime.Seconds(),
			Note: "no ordering: claim 1000, async publish all, wait for acks, mark; two drains, bracketing Watermill's with ours"},
		naive2Res)
	if e.o.skipPeer {
		return append(out, hotResults...), nil
	}

	// Watermill: each configuration beside ours, and the headline: ours
	// beside the fastest of them.
	best := 0
	for i, v := range variants {
		r := Result{Scenario: "relay/watermill-" + v.scenario, EventsPerSec: f(wm[i].rate), Events: wm[i].events,
			Seconds: wm[i].seconds, Note: wm[i].note}
		r.compare(e.o.quick, wm[i].rate/ours, "relay/ours", sample{wm[i].events, wm[i].seconds}, oursS)
		out = append(out, r)
		if wm[i].rate > wm[best].rate {
			best = i
		}
	}
	wmBest := wm[best]
	head := Result{Scenario: "relay/ours-vs-watermill-best",
		Note: fmt.Sprintf("ours (two drains of %d events, %.1f s in all, one before and one after Watermill's) beside the fastest Watermill configuration of this run, %s (%d events in %.1f s)",
			n, oursTime.Seconds(), variants[best].scenario, wmBest.events, wmBest.seconds)}
	head.compare(e.o.quick, ours/wmBest.rate, "relay/watermill-"+variants[best].scenario, oursS, sample{wmBest.events, wmBest.seconds})
	if head.Ratio != nil {
		head.Target, head.Met = ">= 5.0", b(ours/wmBest.rate >= 5)
	}
	out = append(out, head)
	out = append(out, hotResults...)
	return out, nil
}
