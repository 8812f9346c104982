package outbox

// Routes the destination refuses: a RabbitMQ routing key no queue is bound
// for, a Kafka topic that does not exist. Nothing is wrong with the events,
// and the rest of the destination works, so this is neither the events'
// failure (no attempt, never a quarantine) nor an outage of the whole
// destination (the relay goes on publishing the other routes). The route's
// events are held back with a growing delay, tagged in last_error; the
// relay probes the route by making one held event due every OutageProbeMax
// at most, and once a probe event was published (by any relay), it makes
// every held event due at once.
// The argument: docs/design.md, "Outages, routes and readiness".

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
)

// heldPrefix starts the last_error of an event held for its route; the
// probe and the release find held events by it.
const heldPrefix = "held, route unavailable: "

// maxRoutes bounds the routes a relay keeps state for (a routing key may
// carry the aggregate id); beyond it, further routes share one entry.
const maxRoutes = 1000

// otherRoutes names the entry shared by the routes beyond maxRoutes.
const otherRoutes = "(more routes)"

// routeHolds is the relay's memory of the routes it found refused. It is
// only touched by the relay's loop (or the PublishIDs caller).
type routeHolds struct {
	down      map[string]*routeDown
	probeID   uuid.UUID // the held event last made due as a probe
	probes    int       // probes since a route went down
	nextProbe time.Time
	look      int // counts the batches settled, so that a route's failures count once per batch
}

// routeDown is one refused route.
type routeDown struct {
	since    time.Time
	failures int    // batches in which the route failed since it went down
	look     int    // the last of those batches (routeHolds.look)
	err      string // the last failure's error
}

// holdForRoute turns the failure of an event whose route the destination
// refuses into a hold: no attempt, no quarantine, a delay growing with the
// route's failures (RetryBackoffMin … RetryBackoffMax, or the RetryAfter the
// destination asked for if longer), and last_error tagged for the probe.
func (r *Relay) holdForRoute(f *failure) {
	if r.routes.down == nil {
		r.routes.down = map[string]*routeDown{}
	}
	key := f.route
	if _, ok := r.routes.down[key]; !ok && len(r.routes.down) >= maxRoutes {
		key = otherRoutes
	}
	d := r.routes.down[key]
	if d == nil {
		d = &routeDown{since: time.Now()}
		r.routes.down[key] = d
		r.log.Warn("destination refuses a route: holding its events", slog.String("route", f.route), slog.String("error", f.err))
		if len(r.routes.down) == 1 {
			r.routes.probes = 0
			r.routes.nextProbe = time.Now().Add(r.shortDelay(1))
		}
	}
	if d.look != r.routes.look {
		d.look = r.routes.look
		d.failures++
	}
	d.err = f.err
	f.outage, f.attempts, f.quarantine = true, 0, false
	f.delay = max(f.delay, backoff(d.failures, r.cfg.RetryBackoffMin, r.cfg.RetryBackoffMax))
	f.err = truncate(heldPrefix+f.err, 2000)
	r.held.Add(1)
}

// routesUntilProbe is how long an idle relay may wait: d, or less when a route
// probe is due sooner.
func (r *Relay) routesUntilProbe(d time.Duration) time.Duration {
	if len(r.routes.down) == 0 {
		return d
	}
	return max(min(d, time.Until(r.routes.nextProbe)), 0)
}

// probeRoutes runs on the relay's loop while some route is refused, once
// its probe is due. In one statement it checks whether the previous probe
// event was published (by any relay): then the route is back, and every
// held event is made due now (dueAgainSQL: the incremental claim finds it in
// outbox_due_idx), so that they go out in the next claims, and the
// relay forgets the refused routes. Otherwise it makes the held event due
// soonest due now, as the next probe. When no held event is left (other
// relays released or published them), the relay forgets the routes too.
func (r *Relay) probeRoutes(ctx context.Context) {
	if len(r.routes.down) == 0 || time.Now().Before(r.routes.nextProbe) {
		return
	}
	var (
		back     bool
		released int64
		next     *[16]byte
	)
	err := r.planned(r.pool).QueryRow(ctx, r.sql.probeRoutes, [16]byte(r.routes.probeID), heldPrefix).Scan(&back, &released, &next)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("route probe failed", slog.Any("error", err))
		}
		r.routes.nextProbe = time.Now().Add(r.cfg.OutageProbeMax)
		return
	}
	switch {
	case back:
		r.log.Info("refused route published again: releasing the held events", slog.Int64("events", released),
			slog.Any("routes", r.routes.names()))
		r.routes = routeHolds{}
	case next == nil:
		r.log.Info("no event held for a refused route any more", slog.Any("routes", r.routes.names()))
		r.routes = routeHolds{}
	default:
		r.routes.probeID = *next
		r.routes.probes++
		r.routes.nextProbe = time.Now().Add(r.shortDelay(r.routes.probes))
	}
}

// names lists the refused routes, sorted.
func (h routeHolds) names() []string {
	out := make([]string, 0, len(h.down))
	for k := range h.down {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// refusedRoutes counts the routes routesHealth reports.
func (r *Relay) refusedRoutes() int {
	n := 0
	for _, d := range r.routes.down {
		if d.failures >= outageReadyAfter {
			n++
		}
	}
	return n
}

// routesHealth is Ready's error for refused routes: those that failed more
// than once (one refusal may be a binding being recreated), or nil.
func (r *Relay) routesHealth() error {
	var names []string
	var first *routeDown
	for _, k := range r.routes.names() {
		d := r.routes.down[k]
		if d.failures < outageReadyAfter {
			continue
		}
		names = append(names, fmt.Sprintf("%q", k))
		if first == nil || d.since.Before(first.since) {
			first = d
		}
	}
	if len(names) == 0 {
		return nil
	}
	if len(names) > 5 {
		names = append(names[:5], fmt.Sprintf("and %d more", len(names)-5))
	}
	return fmt.Errorf("destination refuses route %s for %s, its events held: %s",
		strings.Join(names, ", "), time.Since(first.since).Round(100*time.Millisecond), first.err)
}

// probeRoutesSQL is the route probe's statement ($1: the previous probe
// event, $2: heldPrefix). Held events are unpublished, not quarantined, and
// due in the future but not parked ('infinity'), which is a range of
// outbox_dispatch_idx. The two updates exclude each other ("back" or not),
// and lock rows of held events only, which no writer and no claim holds.
func probeRoutesSQL(events string) string {
	return `WITH back AS (
	SELECT EXISTS (SELECT 1 FROM ` + events + ` WHERE event_id = $1 AND published_at IS NOT NULL AND skipped_at IS NULL) AS back
), released AS (
	UPDATE ` + events + ` e SET available_at = ` + dueAgainSQL() + `
	WHERE (SELECT back FROM back)
	  AND e.published_at IS NULL AND e.quarantined_at IS NULL
	  AND e.available_at > now() AND e.available_at < 'infinity'
	  AND starts_with(e.last_error, $2)
	RETURNING 1
), next AS (
	UPDATE ` + events + ` e SET available_at = ` + dueAgainSQL() + `
	WHERE NOT (SELECT back FROM back) AND e.event_id = (
		SELECT h.event_id FROM ` + events + ` h
		WHERE h.published_at IS NULL AND h.quarantined_at IS NULL
		  AND h.available_at > now() AND h.available_at < 'infinity'
		  AND starts_with(h.last_error, $2)
		ORDER BY h.available_at LIMIT 1
		FOR UPDATE SKIP LOCKED)
	RETURNING e.event_id
)
SELECT (SELECT back FROM back), (SELECT count(*) FROM released), (SELECT event_id FROM next)`
}
