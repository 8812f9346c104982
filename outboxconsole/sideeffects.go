package outboxconsole

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/pgoutbox/outbox/sideeffect"
)

// The side-effect page: the consumers' external calls (package sideeffect)
// that need an operator (parked), whose outcome is unknown, or that are in
// flight, with the audited resolution of a parked or unknown one
// (sideeffect.Admin.Resolve), and the consumers' events waiting on a
// parked attempt (sideeffect.Caller.WaitTx), which resolving it wakes.

// sideEffectsData is the side-effect page's and the overview card's data.
type sideEffectsData struct {
	// Schema is the schema of the side_effects table; Installed reports
	// that it has one.
	Schema    string
	Installed bool
	// Names are the open attempts per name (sideeffect.Admin.Gauges), and
	// Parked, Unknown, InFlight their sums: InFlight the attempts under a
	// live claim, Unknown those whose outcome is unknown (a started one
	// whose lease expired included).
	Names                   []sideeffect.Gauges
	Parked, Unknown         int64
	InFlight                int64
	OldestUnknownAgeSeconds float64
	// Waiting counts the events waiting on an attempt (at most
	// sideeffect.CountWaitsMax; WaitingMore when there are more).
	Waiting     int64
	WaitingMore bool
	// Show is the list shown: "parked", "open" or "waiting"; NameFilter
	// its filter; Attempts (or, for "waiting", Waits) the page of it.
	Show       string
	NameFilter string
	Attempts   []sideeffect.Attempt
	Waits      []sideeffect.WaitingEvent
}

// Stuck counts the attempts that need an operator or a reconciler: parked
// and unknown.
func (s *sideEffectsData) Stuck() int64 { return s.Parked + s.Unknown }

// sideEffectsSummary reads the gauges: one query on the partial indexes of
// open and parked attempts (their cost grows with the names and the open
// attempts, not with the finished ones), after checking that the table
// exists, and the count of waiting events (bounded by
// sideeffect.CountWaitsMax).
func (c *console) sideEffectsSummary(ctx context.Context) (*sideEffectsData, error) {
	d := &sideEffectsData{Schema: c.cfg.SideEffectSchema}
	ok, err := c.se.Exists(ctx)
	if err != nil || !ok {
		return d, err
	}
	d.Installed = true
	if d.Names, err = c.se.Gauges(ctx); err != nil {
		return d, err
	}
	for _, g := range d.Names {
		d.Parked += g.Parked
		d.Unknown += g.Unknown
		d.InFlight += g.Started
		d.OldestUnknownAgeSeconds = max(d.OldestUnknownAgeSeconds, g.OldestUnknownAgeSeconds)
	}
	d.Waiting, d.WaitingMore, err = c.se.CountWaits(ctx)
	return d, err
}

func (c *console) sideEffects(w http.ResponseWriter, r *http.Request) {
	if c.badFilter(w, r, "name", "after", "show") {
		return
	}
	q := r.URL.Query()
	show := q.Get("show")
	switch show {
	case "":
		show = "parked"
	case "parked", "open", "waiting":
	default:
		c.fail(w, r, http.StatusBadRequest, "bad filter", fmt.Errorf("show=%q: use parked, open or waiting", show))
		return
	}
	se, err := c.sideEffectsSummary(r.Context())
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, "read the side effects", err)
		return
	}
	se.Show, se.NameFilter = show, q.Get("name")
	d := pageData{Title: "side effects", SE: se, First: q.Get("after") == "", Notice: sideEffectNotice(r)}
	if !se.Installed {
		c.render(w, r, http.StatusOK, "sideeffects", d)
		return
	}
	var next any
	switch show {
	case "parked":
		f := sideeffect.ParkedFilter{Name: se.NameFilter, Limit: c.cfg.PageSize}
		if a := q.Get("after"); a != "" {
			f.After = new(sideeffect.Cursor)
			if err := decodeCursor(a, f.After); err != nil || !validText(f.After.Name) || !validText(f.After.Key) {
				c.fail(w, r, http.StatusBadRequest, "bad page cursor", fmt.Errorf("%q is not a cursor of this page", a))
				return
			}
		}
		page, err := c.se.Parked(r.Context(), f)
		if err != nil {
			c.fail(w, r, http.StatusInternalServerError, "read the parked attempts", err)
			return
		}
		se.Attempts = page.Attempts
		if page.Next != nil {
			next = page.Next
		}
	case "open":
		f := sideeffect.OpenFilter{Name: se.NameFilter, Limit: c.cfg.PageSize}
		if a := q.Get("after"); a != "" {
			f.After = new(sideeffect.OpenCursor)
			if err := decodeCursor(a, f.After); err != nil || !validText(f.After.Name) || !validText(f.After.Key) {
				c.fail(w, r, http.StatusBadRequest, "bad page cursor", fmt.Errorf("%q is not a cursor of this page", a))
				return
			}
		}
		page, err := c.se.Open(r.Context(), f)
		if err != nil {
			c.fail(w, r, http.StatusInternalServerError, "read the open attempts", err)
			return
		}
		se.Attempts = page.Attempts
		if page.Next != nil {
			next = page.Next
		}
	case "waiting":
		f := sideeffect.WaitsFilter{Name: se.NameFilter, Limit: c.cfg.PageSize}
		if a := q.Get("after"); a != "" {
			f.After = new(sideeffect.WaitCursor)
			if err := decodeCursor(a, f.After); err != nil || !validText(f.After.Consumer) {
				c.fail(w, r, http.StatusBadRequest, "bad page cursor", fmt.Errorf("%q is not a cursor of this page", a))
				return
			}
		}
		page, err := c.se.Waits(r.Context(), f)
		if err != nil {
			c.fail(w, r, http.StatusInternalServerError, "read the waiting events", err)
			return
		}
		se.Waits = page.Waits
		if page.Next != nil {
			next = page.Next
		}
	}
	if next != nil {
		raw, _ := json.Marshal(next)
		d.Next = pageURL(c.base+"/sideeffects", "show", show, "name", se.NameFilter, "after", base64.RawURLEncoding.EncodeToString(raw))
	}
	c.render(w, r, http.StatusOK, "sideeffects", d)
}

// decodeCursor reads a page cursor: base64 of its JSON.
func decodeCursor(s string, into any) error {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, into)
}

// sideEffectNotice is the message after a resolution, from fixed texts.
func sideEffectNotice(r *http.Request) string {
	if r.URL.Query().Get("done") != "resolved" {
		return ""
	}
	switch sideeffect.ResolveAs(r.URL.Query().Get("as")) {
	case sideeffect.ResolveSucceeded:
		return "Attempt resolved as succeeded: its next call returns the recorded outcome. Recorded in the audit log."
	case sideeffect.ResolveFailed:
		return "Attempt resolved as failed: it is never called again. Recorded in the audit log."
	case sideeffect.ResolveRetry:
		return "Attempt released: the next call goes ahead with the same key. Recorded in the audit log."
	}
	return ""
}

// sideEffectStatus maps a refusal of sideeffect.Admin.Resolve to a status:
// a stale page (the attempt was settled meanwhile, or is being called) is a
// conflict.
func sideEffectStatus(err error) int {
	switch {
	case errors.Is(err, sideeffect.ErrFinal), errors.Is(err, sideeffect.ErrInProgress):
		return http.StatusConflict
	case errors.Is(err, sideeffect.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, sideeffect.ErrReasonRequired), errors.Is(err, sideeffect.ErrActorRequired):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// sideEffectResolve settles a parked or unknown attempt through the
// audited sideeffect.Admin.Resolve, as the operator (actor), with a reason.
func (c *console) sideEffectResolve(w http.ResponseWriter, r *http.Request) {
	res := sideeffect.Resolution{
		Name: r.PostForm.Get("name"), Key: r.PostForm.Get("key"),
		As: sideeffect.ResolveAs(r.PostForm.Get("as")), Reason: strings.TrimSpace(r.PostForm.Get("reason")), By: actor(r),
	}
	switch {
	case res.Name == "" || res.Key == "":
		c.fail(w, r, http.StatusBadRequest, "resolve", errors.New("the attempt's name and key are required"))
		return
	case res.As != sideeffect.ResolveSucceeded && res.As != sideeffect.ResolveFailed && res.As != sideeffect.ResolveRetry:
		c.fail(w, r, http.StatusBadRequest, "resolve", fmt.Errorf("resolve as %q: choose succeeded, failed or retry", res.As))
		return
	case res.Reason == "":
		c.fail(w, r, http.StatusBadRequest, "resolve", sideeffect.ErrReasonRequired)
		return
	}
	ok, err := c.se.Exists(r.Context())
	switch {
	case err != nil:
		c.fail(w, r, http.StatusInternalServerError, "resolve", err)
		return
	case !ok:
		c.fail(w, r, http.StatusNotFound, "resolve", fmt.Errorf("schema %s has no side-effect table", c.cfg.SideEffectSchema))
		return
	}
	at, err := c.se.Resolve(r.Context(), res)
	if err != nil {
		c.fail(w, r, sideEffectStatus(err), "resolve", err)
		return
	}
	c.log.Info("console: side-effect attempt resolved", "name", at.Name, "key", at.Key, "as", string(res.As), "state", string(at.State), "by", res.By, "reason", res.Reason)
	http.Redirect(w, r, c.base+"/sideeffects?done=resolved&as="+string(res.As), http.StatusSeeOther)
}
