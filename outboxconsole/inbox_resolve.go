package outboxconsole

import (
	"errors"
	"net/http"
	"strings"

	"github.com/pgoutbox/outbox/inbox"
)

// inboxResolveStatus maps a refusal of inbox.Admin.Resolve to a status: an
// aggregate no longer waiting (the broker redelivered the missing event, or
// someone resolved it meanwhile) is a conflict.
func inboxResolveStatus(err error) int {
	switch {
	case errors.Is(err, inbox.ErrNotWaiting), errors.Is(err, inbox.ErrMarkAhead):
		return http.StatusConflict
	case errors.Is(err, inbox.ErrAggregateNotFound):
		return http.StatusNotFound
	case errors.Is(err, inbox.ErrReasonRequired), errors.Is(err, inbox.ErrActorRequired):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// inboxResolve moves a waiting aggregate's mark past its gap, as `outbox
// inbox resolve` without --to does (inbox.Admin.Resolve, audited as
// "inbox_resolve" by the operator (actor), with the reason): the events in the
// gap are given up and the waiting one is applied at its next delivery.
func (c *console) inboxResolve(w http.ResponseWriter, r *http.Request) {
	res := inbox.Resolution{
		Consumer: r.PostForm.Get("consumer"), AggregateType: r.PostForm.Get("aggregate_type"), AggregateID: r.PostForm.Get("aggregate_id"),
		Reason: strings.TrimSpace(r.PostForm.Get("reason")), By: actor(r),
	}
	switch {
	case res.Consumer == "" || res.AggregateType == "" || res.AggregateID == "":
		c.fail(w, r, http.StatusBadRequest, "resolve", errors.New("the consumer, aggregate type and aggregate id are required"))
		return
	case res.Reason == "":
		c.fail(w, r, http.StatusBadRequest, "resolve", inbox.ErrReasonRequired)
		return
	}
	a, err := c.inbox.Resolve(r.Context(), res)
	if err != nil {
		c.fail(w, r, inboxResolveStatus(err), "resolve", err)
		return
	}
	c.log.Info("console: inbox gap resolved", "consumer", a.Consumer, "aggregate_type", a.AggregateType, "aggregate_id", a.AggregateID,
		"by", res.By, "reason", res.Reason)
	http.Redirect(w, r, c.base+"/inbox?done=inbox-resolved", http.StatusSeeOther)
}
