package outboxconsole

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/redact"
)

// Bulk actions: retry or skip every quarantined event of an event type, or
// whose last error contains a text (or both, and of an aggregate type).
//
// GET /quarantine/bulk previews: how many events match, and the first
// rows. The action covers at most BulkMax of them, oldest quarantine
// first: that set, and its bound (the last one's quarantine time and id),
// are what the confirm form carries, with a digest of the set (each
// event's id and quarantine time) and an HMAC of all of it keyed by the
// session, so that the form cannot be widened. POST /quarantine/bulk
// re-reads the set through the bound: an event quarantined after the
// preview is past the bound and not in it. When the set is not the one
// previewed (an event retried or skipped meanwhile, one committed late
// under the bound), nothing is done and the new preview is shown with what
// changed. Otherwise each event goes through Admin.RetrySeen or
// Admin.SkipSeen, the audited operations, in lane order (so that a lane's
// head is skipped before the event after it): one audit row per event,
// and the library's rules hold (a skip of an event behind an unsettled one
// is refused, and reported, not forced).

// BulkMax is the most events one bulk action retries or skips.
const BulkMax = 500

const (
	// bulkShown is how many of the matching events the preview lists.
	bulkShown = 20
	// bulkCountCap bounds the preview's count of every match.
	bulkCountCap = 10000
	// bulkTimeout bounds applying a bulk action. It runs to the end even
	// when the browser goes away: each event is its own audited
	// transaction, and a half-done action is reported, not left unknown.
	bulkTimeout = 2 * time.Minute
)

// bulkData is what the preview and result pages show.
type bulkData struct {
	Action                              string // "retry" or "skip"
	EventType, ErrorText, AggregateType string
	// Total is how many quarantined events match (TotalCapped: at least
	// that many); Count how many the action covers, Shown the first rows.
	Total       int64
	TotalCapped bool
	Count       int
	Shown       []outbox.EventInfo
	// The confirm form: the bound, the set's digest and their signature.
	Through, Digest, Sig string
	// Done is set on the result page: the events acted on and refused.
	Done    bool
	Applied []outbox.EventInfo
	Refused []bulkRefusal
}

type bulkRefusal struct {
	Event outbox.EventInfo
	Why   string
}

// bulkRequest is the selection of a preview or a confirm.
type bulkRequest struct {
	action, eventType, errorText, aggregateType string
}

func (b bulkRequest) filter() outbox.QuarantineFilter {
	return outbox.QuarantineFilter{EventType: b.eventType, ErrorContains: b.errorText, AggregateType: b.aggregateType}
}

func readBulkRequest(get func(string) string) (bulkRequest, error) {
	b := bulkRequest{action: get("action"), eventType: strings.TrimSpace(get("event_type")),
		errorText: strings.TrimSpace(get("error")), aggregateType: strings.TrimSpace(get("aggregate_type"))}
	switch {
	case b.action != "retry" && b.action != "skip":
		return b, fmt.Errorf("the action is retry or skip, not %q", b.action)
	case b.eventType == "" && b.errorText == "":
		return b, errors.New("give an event type or a text of the last error: a bulk action never takes every quarantined event")
	}
	return b, nil
}

// bulkDigest is the digest of a set of quarantined events: each one's id
// and quarantine time, in order.
func bulkDigest(set []outbox.EventInfo) string {
	h := sha256.New()
	for _, e := range set {
		fmt.Fprintf(h, "%s %s\n", e.ID, formatQuarantineCursor(e.QuarantineCursor()))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// bulkSig signs a preview's confirm form for a session.
func (c *console) bulkSig(session string, b bulkRequest, through string, n int, digest string) string {
	return hex.EncodeToString(c.mac("bulk", c.base, session, b.action, b.eventType, b.errorText, b.aggregateType, through, strconv.Itoa(n), digest))
}

// preview reads the set a bulk action would cover and fills a bulkData
// with it (signed for the request's session, when there is one).
func (c *console) preview(ctx context.Context, r *http.Request, b bulkRequest) (*bulkData, error) {
	f := b.filter()
	total, err := c.admin.CountQuarantined(ctx, f, bulkCountCap)
	if err != nil {
		return nil, err
	}
	f.Limit, f.PreviewBytes = BulkMax, previewBytes
	set, err := c.admin.ListQuarantined(ctx, f)
	if err != nil {
		return nil, err
	}
	bd := &bulkData{Action: b.action, EventType: b.eventType, ErrorText: b.errorText, AggregateType: b.aggregateType,
		Total: total, TotalCapped: total >= bulkCountCap, Count: len(set), Shown: set[:min(len(set), bulkShown)]}
	if len(set) > 0 {
		bd.Through = formatQuarantineCursor(set[len(set)-1].QuarantineCursor())
		bd.Digest = bulkDigest(set)
		if op, ok := operatorOf(r); ok {
			bd.Sig = c.bulkSig(op.session, b, bd.Through, len(set), bd.Digest)
		}
	}
	return bd, nil
}

// bulkPreview shows what a bulk action would do, with the confirm form.
func (c *console) bulkPreview(w http.ResponseWriter, r *http.Request) {
	if c.badFilter(w, r, "action", "event_type", "error", "aggregate_type") {
		return
	}
	b, err := readBulkRequest(r.URL.Query().Get)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, "bulk action", err)
		return
	}
	bd, err := c.preview(r.Context(), r, b)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, "preview the bulk action", err)
		return
	}
	c.render(w, r, http.StatusOK, "bulk", pageData{Title: "bulk " + b.action, Bulk: bd})
}

// bulkApply applies a previewed bulk action, after guard checked the
// session and its CSRF token.
func (c *console) bulkApply(w http.ResponseWriter, r *http.Request) {
	form := r.PostForm
	b, err := readBulkRequest(form.Get)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, "bulk action", err)
		return
	}
	through, n, digest := form.Get("through"), form.Get("n"), form.Get("digest")
	bound, err := parseQuarantineCursor(through)
	count, cerr := strconv.Atoi(n)
	if err != nil || cerr != nil || count < 1 || count > BulkMax {
		c.fail(w, r, http.StatusBadRequest, "bulk action", errors.New("the form carries no preview: preview the action first"))
		return
	}
	op, _ := operatorOf(r)
	if !hmac.Equal([]byte(form.Get("sig")), []byte(c.bulkSig(op.session, b, through, count, digest))) {
		c.fail(w, r, http.StatusForbidden, "bulk action", errors.New("the form is not a preview of this session's: preview the action again"))
		return
	}
	reason := strings.TrimSpace(form.Get("reason"))
	if b.action == "skip" && reason == "" {
		c.fail(w, r, http.StatusBadRequest, "bulk skip", outbox.ErrReasonRequired)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), bulkTimeout)
	defer cancel()
	f := b.filter()
	f.Through, f.Limit = &bound, BulkMax+1
	set, err := c.admin.ListQuarantined(ctx, f)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, "bulk action", err)
		return
	}
	if len(set) != count || bulkDigest(set) != digest {
		bd, err := c.preview(ctx, r, b)
		if err != nil {
			c.fail(w, r, http.StatusInternalServerError, "preview the bulk action", err)
			return
		}
		msg := fmt.Sprintf("Nothing was done: the selection changed since your preview. You previewed %d events; up to the same point, %d match now as they were or newly (events were retried, skipped or quarantined again meanwhile). Below is the selection as it is now: check it and confirm again.", count, len(set))
		c.render(w, r, http.StatusConflict, "bulk", pageData{Title: "bulk " + b.action, Bulk: bd, Error: msg})
		return
	}
	// Lane order: a lane's head is skipped before the event after it.
	order := slices.Clone(set)
	slices.SortFunc(order, func(x, y outbox.EventInfo) int {
		return cmp.Or(cmp.Compare(x.AggregateType, y.AggregateType), cmp.Compare(x.AggregateID, y.AggregateID), cmp.Compare(x.Sequence, y.Sequence))
	})
	by := actor(r)
	bd := &bulkData{Action: b.action, EventType: b.eventType, ErrorText: b.errorText, AggregateType: b.aggregateType, Count: len(set), Done: true}
	for i, e := range order {
		if ctx.Err() != nil {
			for _, e := range order[i:] {
				bd.Refused = append(bd.Refused, bulkRefusal{Event: e, Why: "not done: the action ran out of time (" + bulkTimeout.String() + ")"})
			}
			break
		}
		if b.action == "retry" {
			_, err = c.admin.RetrySeen(ctx, e.QuarantineCursor(), by)
		} else {
			_, err = c.admin.SkipSeen(ctx, e.QuarantineCursor(), by, reason)
		}
		if err != nil {
			if actionStatus(err) >= 500 {
				c.log.Error("console: bulk "+b.action, "event_id", e.ID, "err", err)
			}
			bd.Refused = append(bd.Refused, bulkRefusal{Event: e, Why: safeText(oneLine(redact.Text(err.Error())))})
			continue
		}
		bd.Applied = append(bd.Applied, e)
	}
	c.log.Info("console: bulk "+b.action, "event_type", b.eventType, "error_contains", b.errorText, "aggregate_type", b.aggregateType,
		"previewed", count, "applied", len(bd.Applied), "refused", len(bd.Refused), "by", by, "reason", reason)
	c.render(w, r, http.StatusOK, "bulk", pageData{Title: "bulk " + b.action, Bulk: bd})
}
