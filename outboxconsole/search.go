package outboxconsole

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
)

// Finding an event: by id (one lookup of the primary key), by aggregate
// (its lane, then its events a page at a time by sequence), or by event
// type (outbox.Admin.FindEventsByType: a bounded walk of an index, a page
// at a time). The event's page shows its headers and payload, escaped;
// /events/{id}/payload downloads the payload as its raw bytes.

const (
	// payloadShowBytes is the most of a payload the event's page shows
	// (the writer's default limit: all of it, unless written by hand).
	payloadShowBytes = outbox.MaxPayloadBytesDefault
	// hexShowBytes is the most of a binary payload shown as a hex dump.
	hexShowBytes = 4096
)

// findData is what the search and event pages show.
type findData struct {
	// The search: one of ID, the aggregate, or EventType (Settled: among
	// the settled events), as typed.
	ID, AggregateType, AggregateID, EventType string
	Settled                                   bool
	// Searched is set once a search ran; NotFound when an id matched
	// nothing.
	Searched, NotFound bool
	Events             []outbox.EventView
	Lane               *outbox.Lane
	// Scanned is how many events a type search read for this page.
	Scanned int
	// FromHead is the link to the aggregate's events from its first
	// unsettled one.
	FromHead string

	// The event's page.
	Event *outbox.EventDetail
	// PayloadText is the payload as text (JSON indented), or PayloadHex a
	// hex dump of the start of a binary one; PayloadCut says the page
	// shows only the start.
	PayloadText, PayloadHex string
	PayloadCut              bool
}

func (c *console) events(w http.ResponseWriter, r *http.Request) {
	if c.badFilter(w, r, "id", "aggregate_type", "aggregate_id", "event_type", "scope", "after") {
		return
	}
	q := r.URL.Query()
	fd := &findData{ID: strings.TrimSpace(q.Get("id")), AggregateType: q.Get("aggregate_type"), AggregateID: q.Get("aggregate_id"),
		EventType: q.Get("event_type"), Settled: q.Get("scope") == "settled"}
	d := pageData{Title: "find", Find: fd, First: q.Get("after") == ""}
	ctx := r.Context()
	switch {
	case fd.ID != "":
		id, err := uuid.Parse(fd.ID)
		if err != nil {
			c.fail(w, r, http.StatusBadRequest, "bad event id", fmt.Errorf("%q is not an event id (a UUID)", fd.ID))
			return
		}
		if _, err := c.admin.Event(ctx, id); err != nil {
			if errors.Is(err, outbox.ErrEventNotFound) {
				fd.Searched, fd.NotFound = true, true
				c.render(w, r, http.StatusNotFound, "events", d)
				return
			}
			c.fail(w, r, http.StatusInternalServerError, "find the event", err)
			return
		}
		http.Redirect(w, r, c.base+"/events/"+id.String(), http.StatusSeeOther)
		return
	case fd.AggregateType != "" || fd.AggregateID != "":
		if fd.AggregateType == "" || fd.AggregateID == "" {
			c.fail(w, r, http.StatusBadRequest, "find an aggregate", errors.New("give both the aggregate type and the aggregate id"))
			return
		}
		f := outbox.AggregateEventsFilter{AggregateType: fd.AggregateType, AggregateID: fd.AggregateID, Limit: c.cfg.PageSize + 1}
		if a := q.Get("after"); a != "" {
			n, err := strconv.ParseInt(a, 10, 64)
			if err != nil || n < 0 {
				c.fail(w, r, http.StatusBadRequest, "bad page cursor", fmt.Errorf("%q is not a sequence", a))
				return
			}
			f.After = n
		}
		lane, err := c.admin.Lane(ctx, fd.AggregateType, fd.AggregateID)
		if err != nil {
			c.fail(w, r, http.StatusInternalServerError, "read the lane", err)
			return
		}
		evs, err := c.admin.ListAggregateEvents(ctx, f)
		if err != nil {
			c.fail(w, r, http.StatusInternalServerError, "read the aggregate's events", err)
			return
		}
		fd.Searched, fd.Lane = true, &lane
		if lane.Head != nil {
			fd.FromHead = pageURL(c.base+"/events", "aggregate_type", fd.AggregateType, "aggregate_id", fd.AggregateID, "after", strconv.FormatInt(lane.Head.Sequence-1, 10))
		}
		if len(evs) > c.cfg.PageSize {
			evs = evs[:c.cfg.PageSize]
			d.Next = pageURL(c.base+"/events", "aggregate_type", fd.AggregateType, "aggregate_id", fd.AggregateID, "after", strconv.FormatInt(evs[len(evs)-1].Sequence, 10))
		}
		fd.Events = evs
	case fd.EventType != "":
		f := outbox.EventTypeFilter{EventType: fd.EventType, Settled: fd.Settled, Limit: c.cfg.PageSize}
		if a := q.Get("after"); a != "" {
			cur, err := parseTypeCursor(a)
			if err != nil {
				c.fail(w, r, http.StatusBadRequest, "bad page cursor", err)
				return
			}
			f.After = &cur
		}
		page, err := c.admin.FindEventsByType(ctx, f)
		if err != nil {
			c.fail(w, r, http.StatusInternalServerError, "find events by type", err)
			return
		}
		fd.Searched, fd.Events, fd.Scanned = true, page.Events, page.Scanned
		if page.Next != nil {
			scope := ""
			if fd.Settled {
				scope = "settled"
			}
			d.Next = pageURL(c.base+"/events", "event_type", fd.EventType, "scope", scope, "after", formatTypeCursor(*page.Next))
		}
	}
	c.render(w, r, http.StatusOK, "events", d)
}

// formatTypeCursor and parseTypeCursor carry a type search's position in
// a URL.
func formatTypeCursor(cur outbox.EventTypeCursor) string {
	raw, _ := json.Marshal(cur)
	return base64.RawURLEncoding.EncodeToString(raw)
}

func parseTypeCursor(s string) (outbox.EventTypeCursor, error) {
	var cur outbox.EventTypeCursor
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(raw, &cur)
	}
	if err == nil && (!validText(cur.AggregateType) || !validText(cur.AggregateID)) {
		err = errors.New("the cursor holds a NUL or bytes that are not UTF-8")
	}
	if err != nil {
		return cur, fmt.Errorf("%q is not a page cursor: %w", s, err)
	}
	return cur, nil
}

// pathEvent reads the event id of /events/{id}.
func (c *console) pathEvent(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, "bad event id", fmt.Errorf("%q is not an event id (a UUID)", r.PathValue("id")))
		return uuid.Nil, false
	}
	return id, true
}

// event shows one event: its state, headers and payload, and its
// aggregate's lane.
func (c *console) event(w http.ResponseWriter, r *http.Request) {
	id, ok := c.pathEvent(w, r)
	if !ok {
		return
	}
	ev, err := c.admin.EventDetail(r.Context(), id, payloadShowBytes)
	if err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, outbox.ErrEventNotFound) {
			status = http.StatusNotFound
		}
		c.fail(w, r, status, "read the event", err)
		return
	}
	lane, err := c.admin.Lane(r.Context(), ev.AggregateType, ev.AggregateID)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, "read the lane", err)
		return
	}
	fd := &findData{Event: &ev, Lane: &lane, PayloadCut: ev.PayloadSize > int64(len(ev.Payload))}
	switch {
	case utf8.Valid(ev.Payload):
		fd.PayloadText = string(ev.Payload)
		var buf bytes.Buffer
		if !fd.PayloadCut && json.Indent(&buf, ev.Payload, "", "  ") == nil {
			fd.PayloadText = buf.String()
		}
	default:
		n := min(len(ev.Payload), hexShowBytes)
		fd.PayloadHex, fd.PayloadCut = hex.Dump(ev.Payload[:n]), fd.PayloadCut || n < len(ev.Payload)
	}
	c.render(w, r, http.StatusOK, "event", pageData{Title: "event " + id.String(), Find: fd})
}

// payload downloads an event's payload as its raw bytes. Whatever the
// event's content type, it is served as application/octet-stream, as an
// attachment, sandboxed and not sniffed: a payload holding markup is never
// rendered by the browser, on the console's origin or any other.
func (c *console) payload(w http.ResponseWriter, r *http.Request) {
	id, ok := c.pathEvent(w, r)
	if !ok {
		return
	}
	ev, err := c.admin.EventDetail(r.Context(), id, 0)
	if err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, outbox.ErrEventNotFound) {
			status = http.StatusNotFound
		}
		c.fail(w, r, status, "read the payload", err)
		return
	}
	ext := ".bin"
	if mt, _, _ := mime.ParseMediaType(ev.ContentType); mt == outbox.ContentTypeJSON || strings.HasSuffix(mt, "+json") {
		ext = ".json"
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", `attachment; filename="`+id.String()+ext+`"`)
	h.Set("Content-Security-Policy", "sandbox; default-src 'none'")
	h.Set("Content-Length", strconv.Itoa(len(ev.Payload)))
	_, _ = w.Write(ev.Payload)
}
