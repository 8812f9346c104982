package outboxconsole

import (
	"bytes"

	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	neturl "net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/redact"
)

// overviewListSize is the number of quarantined events and waiting
// aggregates the overview shows (the full lists have pages of their own).
const overviewListSize = 10

// previewBytes is how much of a payload the quarantine page reads; it shows
// at most previewRunes characters of it.
const (
	previewBytes = 400
	previewRunes = 160
)

// pageData is what every template gets.
type pageData struct {
	Title, Nav string
	Schema     string
	// Database and IndexURL are set on a source's pages of a console of
	// several (NewMulti): its database, and the index of every source.
	// Index is set on that index, Sources are its rows.
	Database string
	IndexURL string
	Index    bool
	Sources  []SourceFigures
	// Operator is the logged-in operator's name; CSRF the token of their
	// forms; CanAct is set when actions are offered.
	Operator  string
	CSRF      string
	CanLogin  bool
	CanAct    bool
	ReadOnly  bool
	CanReplay bool
	Refresh   int
	Now       time.Time
	Error     string
	Notice    string

	Status      *outbox.Status
	Chart       chart
	Quarantined []outbox.EventInfo
	Consumers   []inbox.ConsumerWaiting
	Waiting     []inbox.AggregateInfo
	Operations  []outbox.Operation
	// Next is the URL of the next page of the page's list, empty on the
	// last page; TypeFilter and ConsumerFilter the list's filters.
	Next           string
	TypeFilter     string
	ConsumerFilter string
	First          bool

	// ProxyHeader names the header a proxy passes the operator in, when
	// the proxy's identity replaces the login.
	ProxyHeader string

	// Find is the search's and the event page's; Bulk the bulk action's.
	Find *findData
	Bulk *bulkData

	// SE is the side-effect page's data and the overview's card
	// (sideeffects.go); History the overview's charts beside Chart and
	// Destinations its health by destination (chart.go, health.go).
	SE           *sideEffectsData
	History      []chart
	Destinations []destinationHealth
}

var funcs = template.FuncMap{
	"age":     fmtAge,
	"since":   func(t, now time.Time) string { return fmtAge(now.Sub(t).Seconds()) },
	"until":   func(t, now time.Time) string { return fmtAge(t.Sub(now).Seconds()) },
	"ts":      func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
	"num":     fmtNum,
	"preview": func(s string) string { return cut(safeText(oneLine(s)), previewRunes) },
	"line":    func(s string, n int) string { return cut(safeText(oneLine(redact.Text(s))), n) },
	"detail":  fmtDetail,
	"add1":    func(n int64) int64 { return n + 1 },
	"sub1":    func(n int64) int64 { return n - 1 },
	"t":       safeText,
	"deref": func(t *time.Time) time.Time {
		if t == nil {
			return time.Time{}
		}
		return *t
	},
}

// pageNames are the pages of a schema's console.
var pageNames = []string{"overview", "quarantine", "inbox", "operations", "sideeffects", "login", "error", "events", "event", "bulk"}

// parseTemplates parses the pages, their links under base: the template
// function p prefixes a console path with it ("/quarantine" is
// base+"/quarantine"); /login, /logout and /static/ are the gate's, at
// the root, and stay as they are.
func parseTemplates(base string, names []string) (map[string]*template.Template, error) {
	fm := template.FuncMap{"p": func(path string) string { return base + path }}
	pages := map[string]*template.Template{}
	for _, name := range names {
		// part_*.html define blocks shared by pages (an event list, a
		// lane, the side-effect card, the health tables, a chart).
		t, err := template.New(name).Funcs(funcs).Funcs(fm).ParseFS(templateFS, "templates/layout.html", "templates/part_*.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("outboxconsole: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// path is a console path under the console's base.
func (c *console) path(p string) string { return c.base + p }

// render fills the parts of d every page shares and writes the page. It
// renders into a buffer first, so that a template error becomes a 500, not
// half a page.
func (c *console) render(w http.ResponseWriter, r *http.Request, status int, page string, d pageData) {
	d.Nav, d.Schema, d.ReadOnly, d.Now = page, c.cfg.Schema, c.cfg.ReadOnly, time.Now().UTC()
	if c.base != "" {
		d.Database, d.IndexURL = c.database, "/"
	}
	d.Index = c.index
	if d.Title == "" {
		d.Title = page
	}
	// A bulk preview stays as the operator read it, and its result is the
	// answer to a POST, which a reload would send again.
	if c.cfg.Refresh > 0 && page != "login" && page != "error" && page != "bulk" {
		d.Refresh = int(c.cfg.Refresh.Seconds())
	}
	d.CanLogin, d.ProxyHeader = c.sessionKey != nil, c.proxy.header
	if op, ok := operatorOf(r); ok {
		d.Operator, d.CSRF = op.name, c.csrfToken(op.session)
		if !c.cfg.ReadOnly {
			d.CanAct, d.CanReplay = true, c.cfg.Publisher != nil
		}
	}
	if d.Notice == "" {
		d.Notice = notice(r)
	}
	var buf bytes.Buffer
	if err := c.pages[page].ExecuteTemplate(&buf, "layout", d); err != nil {
		c.log.Error("console: render page", "page", page, "err", err)
		http.Error(w, "could not render the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail renders an error page for a failed read or action.
func (c *console) fail(w http.ResponseWriter, r *http.Request, status int, what string, err error) {
	if status >= 500 {
		c.log.Error("console: "+what, "path", r.URL.Path, "err", err)
	}
	c.render(w, r, status, "error", pageData{Title: "error", Error: what + ": " + safeText(oneLine(redact.Text(err.Error())))})
}

// notice is the message of a redirect after an action, from fixed texts
// (the query only picks one and names the event, parsed as a UUID).
func notice(r *http.Request) string {
	q := r.URL.Query()
	id, err := uuid.Parse(q.Get("event"))
	switch q.Get("done") {
	case "retried":
		if err == nil {
			return "Event " + id.String() + " retried: it is back in its lane."
		}
	case "skipped":
		if err == nil {
			return "Event " + id.String() + " skipped; its aggregate moves on."
		}
	case "inbox-resolved":
		return "Gap resolved: the waiting event is applied at its next delivery; the events in the gap are given up. Recorded in the audit log."
	case "replayed":
		if n, err := strconv.ParseInt(q.Get("n"), 10, 64); err == nil {
			return fmt.Sprintf("Replay done: %d events published again.", n)
		}
	}
	return ""
}

func (c *console) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	st, err := c.admin.Status(ctx)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, "read the status", err)
		return
	}
	hist, err := c.admin.History(ctx)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, "read the last hour", err)
		return
	}
	series := make([]outbox.MinuteCount, len(hist))
	for i, m := range hist {
		series[i] = outbox.MinuteCount{Minute: m.Minute, Published: m.Published}
	}
	d := pageData{Title: "overview", Status: &st, Chart: newChart(series, st.At), History: historyCharts(hist, st.At),
		Destinations: destinationsOf(st.Relays)}
	if d.SE, err = c.sideEffectsSummary(ctx); err != nil {
		c.fail(w, r, http.StatusInternalServerError, "read the side effects", err)
		return
	}
	if st.Quarantined > 0 {
		if d.Quarantined, err = c.admin.ListQuarantined(ctx, outbox.QuarantineFilter{Limit: overviewListSize}); err != nil {
			c.fail(w, r, http.StatusInternalServerError, "read the quarantine", err)
			return
		}
	}
	if d.Consumers, err = c.inbox.Gauges(ctx); err != nil {
		c.fail(w, r, http.StatusInternalServerError, "read the inbox consumers", err)
		return
	}
	rep, err := c.inbox.Waiting(ctx, inbox.WaitingFilter{Limit: overviewListSize})
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, "read the waiting aggregates", err)
		return
	}
	d.Waiting = rep.Aggregates
	c.render(w, r, http.StatusOK, "overview", d)
}

// badFilter answers 400 for a filter or cursor that no row can match
// because PostgreSQL cannot even compare with it (a NUL, bytes that are not
// UTF-8), instead of letting the query fail with a 500.
func (c *console) badFilter(w http.ResponseWriter, r *http.Request, names ...string) bool {
	q := r.URL.Query()
	for _, n := range names {
		for _, v := range q[n] {
			if !validText(v) {
				c.fail(w, r, http.StatusBadRequest, "bad filter", fmt.Errorf("%s holds a NUL or bytes that are not UTF-8", n))
				return true
			}
		}
	}
	return false
}

func (c *console) quarantine(w http.ResponseWriter, r *http.Request) {
	if c.badFilter(w, r, "type", "after") {
		return
	}
	q := r.URL.Query()
	f := outbox.QuarantineFilter{AggregateType: q.Get("type"), Limit: c.cfg.PageSize + 1, PreviewBytes: previewBytes}
	if a := q.Get("after"); a != "" {
		cur, err := parseQuarantineCursor(a)
		if err != nil {
			c.fail(w, r, http.StatusBadRequest, "bad page cursor", err)
			return
		}
		f.After = &cur
	}
	events, err := c.admin.ListQuarantined(r.Context(), f)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, "read the quarantine", err)
		return
	}
	d := pageData{Title: "quarantine", TypeFilter: f.AggregateType, First: f.After == nil}
	if len(events) > c.cfg.PageSize {
		events = events[:c.cfg.PageSize]
		next := pageURL(c.base+"/quarantine", "type", f.AggregateType, "after", formatQuarantineCursor(events[len(events)-1].QuarantineCursor()))
		d.Next = next
	}
	d.Quarantined = events
	c.render(w, r, http.StatusOK, "quarantine", d)
}

func (c *console) inboxPage(w http.ResponseWriter, r *http.Request) {
	if c.badFilter(w, r, "consumer", "after") {
		return
	}
	q := r.URL.Query()
	f := inbox.WaitingFilter{Consumer: q.Get("consumer"), Limit: c.cfg.PageSize + 1}
	if a := q.Get("after"); a != "" {
		var cur inbox.WaitingCursor
		raw, err := base64.RawURLEncoding.DecodeString(a)
		if err == nil {
			err = json.Unmarshal(raw, &cur)
		}
		if err == nil && (!validText(cur.Consumer) || !validText(cur.AggregateType) || !validText(cur.AggregateID)) {
			err = errors.New("the cursor holds a NUL or bytes that are not UTF-8")
		}
		if err != nil {
			c.fail(w, r, http.StatusBadRequest, "bad page cursor", err)
			return
		}
		f.After = &cur
	}
	rep, err := c.inbox.Waiting(r.Context(), f)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, "read the waiting aggregates", err)
		return
	}
	d := pageData{Title: "inbox", ConsumerFilter: f.Consumer, First: f.After == nil}
	if d.Consumers, err = c.inbox.Gauges(r.Context()); err != nil {
		c.fail(w, r, http.StatusInternalServerError, "read the inbox consumers", err)
		return
	}
	if len(rep.Aggregates) > c.cfg.PageSize {
		rep.Aggregates = rep.Aggregates[:c.cfg.PageSize]
		raw, _ := json.Marshal(rep.Aggregates[len(rep.Aggregates)-1].WaitingCursor())
		d.Next = pageURL(c.base+"/inbox", "consumer", f.Consumer, "after", base64.RawURLEncoding.EncodeToString(raw))
	}
	d.Waiting = rep.Aggregates
	c.render(w, r, http.StatusOK, "inbox", d)
}

func (c *console) operations(w http.ResponseWriter, r *http.Request) {
	f := outbox.OperationFilter{Limit: c.cfg.PageSize + 1}
	if b := r.URL.Query().Get("before"); b != "" {
		n, err := strconv.ParseInt(b, 10, 64)
		if err != nil || n < 1 {
			c.fail(w, r, http.StatusBadRequest, "bad page cursor", fmt.Errorf("%q is not an operation id", b))
			return
		}
		f.Before = n
	}
	ops, err := c.admin.Operations(r.Context(), f)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, "read the operations", err)
		return
	}
	d := pageData{Title: "operations", First: f.Before == 0}
	if len(ops) > c.cfg.PageSize {
		ops = ops[:c.cfg.PageSize]
		d.Next = pageURL(c.base+"/operations", "before", strconv.FormatInt(ops[len(ops)-1].ID, 10))
	}
	d.Operations = ops
	c.render(w, r, http.StatusOK, "operations", d)
}

func formatQuarantineCursor(c outbox.QuarantineCursor) string {
	return c.QuarantinedAt.UTC().Format(time.RFC3339Nano) + "_" + c.ID.String()
}

func parseQuarantineCursor(s string) (outbox.QuarantineCursor, error) {
	at, id, ok := strings.Cut(s, "_")
	if !ok {
		return outbox.QuarantineCursor{}, fmt.Errorf("%q is not a quarantine cursor", s)
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return outbox.QuarantineCursor{}, fmt.Errorf("%q is not a quarantine cursor", s)
	}
	u, err := uuid.Parse(id)
	if err != nil {
		return outbox.QuarantineCursor{}, fmt.Errorf("%q is not a quarantine cursor", s)
	}
	return outbox.QuarantineCursor{QuarantinedAt: t, ID: u}, nil
}

// pageURL builds a local URL with the non-empty query parameters kv.
func pageURL(path string, kv ...string) string {
	var b strings.Builder
	b.WriteString(path)
	sep := "?"
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			continue
		}
		b.WriteString(sep + kv[i] + "=" + neturl.QueryEscape(kv[i+1]))
		sep = "&"
	}
	return b.String()
}

func fmtAge(s float64) string {
	if s < 0 {
		s = 0
	}
	d := time.Duration(s * float64(time.Second))
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%.0fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm %02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh %02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %02dh", int(d.Hours())/24, int(d.Hours())%24)
}

func fmtNum(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func cut(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}

func fmtDetail(m map[string]any) string {
	if len(m) == 0 {
		return ""
	}
	b, _ := json.Marshal(m)
	return cut(safeText(redact.Text(string(b))), 200)
}
