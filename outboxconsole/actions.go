package outboxconsole

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
)

// Audit actors. The audit log (outbox_operations.actor, and the by of a
// skip, an inbox resolution or a side-effect resolution) records a
// console action as ActorTokenPrefix or ActorProxyPrefix followed by the
// operator's name, so that it says how the console knew who acted.
// Before these, both were recorded as "console:<name>".
const (
	// ActorTokenPrefix: the operator logged in with the shared token and
	// typed the name after it at login (a claim of whoever holds the
	// token; never contains a colon).
	ActorTokenPrefix = "console:token:"
	// ActorProxyPrefix: a trusted proxy (Config.AuthProxyHeader) passed
	// the name after it, as it authenticated the operator.
	ActorProxyPrefix = "console:proxy:"
)

// actor is who the audit log says acted: ActorTokenPrefix or
// ActorProxyPrefix, then the operator's name.
func actor(r *http.Request) string {
	op, _ := operatorOf(r)
	if op.viaProxy {
		return ActorProxyPrefix + op.name
	}
	return ActorTokenPrefix + op.name
}

func (c *console) eventParam(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	id, err := uuid.Parse(r.PostForm.Get("event_id"))
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, "bad event id", err)
		return uuid.Nil, false
	}
	return id, true
}

// actionStatus maps an Admin refusal to a status: a stale page (the event
// was settled or retried meanwhile), or a skip of an event behind an
// unsettled one of its aggregate (the message names that one), is a
// conflict, not a server error.
func actionStatus(err error) int {
	switch {
	case errors.Is(err, outbox.ErrNotQuarantined), errors.Is(err, outbox.ErrNotLaneHead), errors.Is(err, outbox.ErrQuarantineChanged):
		return http.StatusConflict
	case errors.Is(err, outbox.ErrEventNotFound):
		return http.StatusNotFound
	case errors.Is(err, outbox.ErrReasonRequired), errors.Is(err, outbox.ErrActorRequired):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

func (c *console) retry(w http.ResponseWriter, r *http.Request) {
	id, ok := c.eventParam(w, r)
	if !ok {
		return
	}
	by := actor(r)
	e, err := c.admin.Retry(r.Context(), id, by)
	if err != nil {
		c.fail(w, r, actionStatus(err), "retry", err)
		return
	}
	c.log.Info("console: event retried", "event_id", id, "aggregate_type", e.AggregateType, "aggregate_id", e.AggregateID, "by", by)
	http.Redirect(w, r, c.base+"/quarantine?done=retried&event="+id.String(), http.StatusSeeOther)
}

func (c *console) skip(w http.ResponseWriter, r *http.Request) {
	id, ok := c.eventParam(w, r)
	if !ok {
		return
	}
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	if reason == "" {
		c.fail(w, r, http.StatusBadRequest, "skip", outbox.ErrReasonRequired)
		return
	}
	by := actor(r)
	e, err := c.admin.Skip(r.Context(), id, by, reason)
	if err != nil {
		c.fail(w, r, actionStatus(err), "skip", err)
		return
	}
	c.log.Info("console: event skipped", "event_id", id, "aggregate_type", e.AggregateType, "aggregate_id", e.AggregateID, "by", by, "reason", reason)
	http.Redirect(w, r, c.base+"/quarantine?done=skipped&event="+id.String(), http.StatusSeeOther)
}

// replay publishes one aggregate's events again. It runs within the
// request, bounded by Config.ReplayTimeout; the audit row records the
// outcome either way.
func (c *console) replay(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Publisher == nil {
		c.fail(w, r, http.StatusNotFound, "replay", errors.New("no destination configured: start the console with --destination to replay"))
		return
	}
	typ, id := strings.TrimSpace(r.PostForm.Get("aggregate_type")), strings.TrimSpace(r.PostForm.Get("aggregate_id"))
	if typ == "" || id == "" {
		c.fail(w, r, http.StatusBadRequest, "replay", errors.New("give the aggregate type and id: the console replays one aggregate"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.ReplayTimeout)
	defer cancel()
	by := actor(r)
	res, err := c.admin.Replay(ctx, c.cfg.Publisher, outbox.ReplayConfig{AggregateType: typ, AggregateID: id, By: by})
	if err != nil {
		c.fail(w, r, http.StatusBadGateway, "replay", err)
		return
	}
	c.log.Info("console: aggregate replayed", "aggregate_type", typ, "aggregate_id", id, "events", res.Events, "replay_id", res.ReplayID, "by", by)
	http.Redirect(w, r, c.base+"/?done=replayed&n="+strconv.FormatInt(res.Events, 10), http.StatusSeeOther)
}
