package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/examples/orders/ordersapi"
)

// SKUs are the catalogue the orders migration seeds.
var SKUs = []string{"SKU-1001", "SKU-1002", "SKU-1003", "SKU-1004", "SKU-1005", "SKU-1006", "SKU-1007", "SKU-1008"}

// Kind is what a command does.
type Kind int

// Command kinds.
const (
	// Create places an order.
	Create Kind = iota + 1
	// Rollback places an order naming an unknown SKU: the API writes the
	// order and its event, then the transaction rolls back (422).
	Rollback
	// Cancel cancels a committed order.
	Cancel
	// CancelAgain cancels an order whose cancellation committed (409).
	CancelAgain
)

// String names the kind.
func (k Kind) String() string {
	switch k {
	case Create:
		return "create"
	case Rollback:
		return "rollback"
	case Cancel:
		return "cancel"
	case CancelAgain:
		return "cancel-again"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Outcome is what became of a command, as the client knows it.
type Outcome int

// Outcomes.
const (
	// NotSent: no request reached the API (connection refused until the
	// run ended).
	NotSent Outcome = iota
	// Committed: the API answered 2xx (or a retry proved it committed, or the
	// database did for an ambiguous one).
	Committed
	// RolledBack: the API said it rolled back (422 unknown SKU), or an
	// ambiguous command left nothing in the database.
	RolledBack
	// Refused: the expected refusal of a second cancel (409).
	Refused
	// Ambiguous: no definitive answer yet (500, connection reset); Resolve
	// decides from the database.
	Ambiguous
)

// Command is one logical command of the driver, with all its HTTP attempts.
type Command struct {
	Seq        int
	Kind       Kind
	CustomerID string // unique per create, so its rows can be found
	Key        string // Idempotency-Key, "" for none
	Items      []orderevents.Item
	// Resend asks the driver to send a committed create again with the same
	// key (an idempotent retry): it must get the same order back.
	Resend bool
	// ReuseKey asks the driver to send a committed create's key again with
	// another body: the API must refuse it (422) and write nothing.
	ReuseKey bool
	OrderID  string
	Outcome  Outcome
	// Requests counts HTTP requests sent; Replays the 200 answers with
	// Idempotent-Replayed; KeyReusesRefused the 422 answers to ReuseKey;
	// AmbiguousAttempts the attempts without a definitive answer.
	Requests, Replays, KeyReusesRefused, AmbiguousAttempts int
	// ResolvedByDB is set when Resolve decided the outcome.
	ResolvedByDB bool
}

// Ledger is the client's record of every command: the truth the checker
// compares PostgreSQL and the broker against. It is safe for concurrent use.
type Ledger struct {
	mu        sync.Mutex
	cmds      []*Command
	open      []string // committed orders not chosen for a cancel yet
	cancelled []string // orders whose cancel committed
	problems  []string // unexpected answers
	idem      []string // idempotency problems seen by the client
}

func (l *Ledger) add(c *Command) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c.Seq = len(l.cmds) + 1
	l.cmds = append(l.cmds, c)
}

// Commands returns a copy of every command.
func (l *Ledger) Commands() []Command {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Command, len(l.cmds))
	for i, c := range l.cmds {
		out[i] = *c
	}
	return out
}

// Len counts the commands sent so far.
func (l *Ledger) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.cmds)
}

// Committed counts the committed commands.
func (l *Ledger) Committed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.cmds {
		if c.Outcome == Committed {
			n++
		}
	}
	return n
}

func (l *Ledger) problem(kind *[]string, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	*kind = append(*kind, fmt.Sprintf(format, args...))
}

// pick removes and returns a random entry of list (nil rng: the first); rng
// is only used under l.mu.
func (l *Ledger) pick(list *[]string, rng *rand.Rand) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(*list) == 0 {
		return "", false
	}
	i := 0
	if rng != nil {
		i = rng.IntN(len(*list))
	}
	id := (*list)[i]
	(*list)[i] = (*list)[len(*list)-1]
	*list = (*list)[:len(*list)-1]
	return id, true
}

// Open returns the committed orders not chosen for a cancellation yet.
func (l *Ledger) Open() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.open...)
}

// take removes id from the open orders; it reports whether it was there.
func (l *Ledger) take(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, x := range l.open {
		if x == id {
			l.open = append(l.open[:i], l.open[i+1:]...)
			return true
		}
	}
	return false
}

func (l *Ledger) set(c *Command, f func(c *Command)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(c)
}

// Mix is the share of each kind of command, in percent (the rest are
// creates); KeyedPercent of the creates carry an Idempotency-Key,
// ResendPercent of those are sent twice and ReuseKeyPercent have their key
// sent again with another body.
type Mix struct {
	RollbackPercent, CancelPercent, CancelAgainPercent, KeyedPercent, ResendPercent, ReuseKeyPercent int
}

// DefaultMix is the command mix of "outbox chaos" and "outbox demo".
var DefaultMix = Mix{RollbackPercent: 10, CancelPercent: 20, CancelAgainPercent: 4, KeyedPercent: 85, ResendPercent: 25, ReuseKeyPercent: 5}

// Driver sends commands to the order API and records them in its Ledger.
type Driver struct {
	url    string
	tag    string
	rng    *rand.Rand // the command stream (one goroutine)
	pick   *rand.Rand // orders to cancel (used under Ledger.mu)
	n      int
	mix    Mix
	client *http.Client
	Ledger *Ledger
}

// NewDriver returns a driver for the API at url; tag makes its customer ids
// and keys unique; seed drives its choice of commands.
func NewDriver(url, tag string, seed uint64, mix Mix) *Driver {
	return &Driver{
		url: url, tag: tag, mix: mix,
		rng:  rand.New(rand.NewPCG(seed, 0x647269766572)),
		pick: rand.New(rand.NewPCG(seed, 0x7069636b)),
		client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			MaxIdleConnsPerHost: 16, DisableKeepAlives: false,
		}},
		Ledger: &Ledger{},
	}
}

// Close releases the driver's idle connections.
func (d *Driver) Close() { d.client.CloseIdleConnections() }

// next draws the next command (not yet in the ledger). Only one goroutine
// calls it.
func (d *Driver) next() *Command {
	d.n++
	c := &Command{CustomerID: fmt.Sprintf("c-%s-%d", d.tag, d.n)}
	r := d.rng.IntN(100)
	switch {
	case r < d.mix.CancelAgainPercent:
		c.Kind = CancelAgain
	case r < d.mix.CancelAgainPercent+d.mix.CancelPercent:
		c.Kind = Cancel
	case r < d.mix.CancelAgainPercent+d.mix.CancelPercent+d.mix.RollbackPercent:
		c.Kind = Rollback
	default:
		c.Kind = Create
	}
	for _, i := range d.rng.Perm(len(SKUs))[:1+d.rng.IntN(3)] {
		c.Items = append(c.Items, orderevents.Item{SKU: SKUs[i], Quantity: 1 + d.rng.IntN(5)})
	}
	if c.Kind == Rollback {
		c.Items = append(c.Items, orderevents.Item{SKU: "SKU-UNKNOWN-" + c.CustomerID, Quantity: 1})
	}
	if d.rng.IntN(100) < d.mix.KeyedPercent {
		c.Key = "k-" + c.CustomerID
		c.Resend = c.Kind == Create && d.rng.IntN(100) < d.mix.ResendPercent
		if d.mix.ReuseKeyPercent > 0 { // no draw otherwise: older mixes keep their command streams
			c.ReuseKey = c.Kind == Create && d.rng.IntN(100) < d.mix.ReuseKeyPercent
		}
	}
	return c
}

// Run sends commands with clients concurrent workers, at about rate
// commands per second in total, until ctx ends or n commands were sent
// (n <= 0: no limit). Commands without a definitive answer when ctx ends
// stay Ambiguous.
func (d *Driver) Run(ctx context.Context, clients int, rate float64, n int) {
	work := make(chan *Command)
	var wg sync.WaitGroup
	for range max(clients, 1) {
		wg.Go(func() {
			for c := range work {
				d.Do(ctx, c)
			}
		})
	}
	var tick <-chan time.Time
	if rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer t.Stop()
		tick = t.C
	}
	for i := 0; n <= 0 || i < n; i++ {
		if tick != nil {
			select {
			case <-ctx.Done():
			case <-tick:
			}
		}
		if ctx.Err() != nil {
			break
		}
		c := d.next()
		select {
		case work <- c:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(work)
	wg.Wait()
}

// Do runs one command to a definitive answer. A Cancel with an OrderID
// cancels that (open) order; without one, and for CancelAgain, the driver
// picks the order, retrying while ctx allows:
// connection refused (the API is down) is always retried; an ambiguous
// answer (500, connection reset) is retried for creates with a key and for
// cancels, which are safe to repeat. The command is added to the ledger.
func (d *Driver) Do(ctx context.Context, c *Command) {
	switch {
	case c.Kind == Cancel && c.OrderID != "":
		if !d.Ledger.take(c.OrderID) {
			d.Ledger.problem(&d.Ledger.problems, "cancel of order %s, which is not open", c.OrderID)
			return
		}
		c.Items, c.Key, c.Resend = nil, "", false
	case c.Kind == Cancel:
		id, ok := d.Ledger.pick(&d.Ledger.open, d.pick)
		if !ok {
			c.Kind = Create // nothing to cancel yet
			break
		}
		c.OrderID, c.Items, c.Key, c.Resend = id, nil, "", false
	case c.Kind == CancelAgain:
		id, ok := d.Ledger.pick(&d.Ledger.cancelled, d.pick)
		if !ok {
			c.Kind = Create
			break
		}
		c.OrderID, c.Items, c.Key, c.Resend = id, nil, "", false
	}
	d.Ledger.add(c)
	switch c.Kind {
	case Create, Rollback:
		d.create(ctx, c)
	default:
		d.cancel(ctx, c)
	}
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

// attempt classes
const (
	definitive = iota
	refused    // nothing reached the API
	ambiguous  // it may or may not have committed
)

func (d *Driver) send(ctx context.Context, method, path, key string, body any) (answer, int) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, d.url+path, rd)
	if err != nil {
		return answer{}, refused
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(ordersapi.HeaderIdempotencyKey, key)
	}
	resp, err := d.client.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return answer{}, refused
		}
		return answer{}, ambiguous
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode >= 500 {
		return answer{}, ambiguous
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: b}, definitive
}

// retry waits before attempt n+1; it returns false when ctx ended.
func retry(ctx context.Context, n int) bool {
	d := min(time.Duration(n)*50*time.Millisecond, time.Second)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func problemType(a answer) string {
	var p ordersapi.Problem
	_ = json.Unmarshal(a.body, &p)
	return p.Type
}

func (d *Driver) create(ctx context.Context, c *Command) {
	body := ordersapi.CreateRequest{CustomerID: c.CustomerID, Items: c.Items}
	l := d.Ledger
	for n := 1; ; n++ {
		a, class := d.send(ctx, http.MethodPost, "/orders", c.Key, body)
		if class != refused {
			l.set(c, func(c *Command) { c.Requests++ })
		}
		if class == ambiguous {
			l.set(c, func(c *Command) { c.Outcome, c.AmbiguousAttempts = Ambiguous, c.AmbiguousAttempts+1 })
			if c.Key == "" {
				return // not safe to repeat: Resolve decides
			}
		}
		if class != definitive {
			if !retry(ctx, n) {
				return
			}
			continue
		}
		switch {
		case a.status == http.StatusCreated || (a.status == http.StatusOK && a.header.Get(ordersapi.HeaderIdempotentReplayed) == "true"):
			var o ordersapi.Order
			if err := json.Unmarshal(a.body, &o); err != nil || o.ID == "" {
				l.problem(&l.problems, "command %d: %d answer without an order: %s", c.Seq, a.status, a.body)
				return
			}
			if c.Kind == Rollback {
				l.problem(&l.problems, "command %d: an order naming an unknown SKU was accepted (%d)", c.Seq, a.status)
			}
			l.set(c, func(c *Command) {
				c.Outcome, c.OrderID = Committed, o.ID
				if a.status == http.StatusOK {
					c.Replays++
				}
				l.open = append(l.open, o.ID)
			})
			if c.Resend {
				d.resend(ctx, c, body)
			}
			if c.ReuseKey {
				d.reuseKey(ctx, c, body)
			}
			return
		case a.status == http.StatusUnprocessableEntity && problemType(a) == ordersapi.ProblemTypeBase+"unknown-sku" && c.Kind == Rollback:
			l.set(c, func(c *Command) { c.Outcome = RolledBack })
			return
		default:
			l.problem(&l.problems, "command %d (%s): unexpected answer %d %s", c.Seq, c.Kind, a.status, bytes.TrimSpace(a.body))
			l.set(c, func(c *Command) { c.Outcome = Ambiguous })
			return
		}
	}
}

// resend sends a committed create again with its key: the API must answer
// 200 with Idempotent-Replayed and the same order.
func (d *Driver) resend(ctx context.Context, c *Command, body ordersapi.CreateRequest) {
	a, ok := d.sendSafe(ctx, c, http.MethodPost, "/orders", c.Key, body)
	if !ok {
		return
	}
	l := d.Ledger
	var o ordersapi.Order
	_ = json.Unmarshal(a.body, &o)
	if a.status != http.StatusOK || a.header.Get(ordersapi.HeaderIdempotentReplayed) != "true" || o.ID != c.OrderID {
		l.problem(&l.idem, "command %d: resent with key %s: %d replayed=%q order %s, want 200 replayed order %s",
			c.Seq, c.Key, a.status, a.header.Get(ordersapi.HeaderIdempotentReplayed), o.ID, c.OrderID)
		return
	}
	l.set(c, func(c *Command) { c.Replays++ })
}

// reuseKey sends a committed create's key with another body: the API must
// refuse it with a 422 idempotency-key-reused problem (and write nothing,
// which Check sees: one order per customer and per key).
func (d *Driver) reuseKey(ctx context.Context, c *Command, body ordersapi.CreateRequest) {
	other := ordersapi.CreateRequest{CustomerID: body.CustomerID, Items: slices.Clone(body.Items)}
	other.Items[0].Quantity++
	a, ok := d.sendSafe(ctx, c, http.MethodPost, "/orders", c.Key, other)
	if !ok {
		return
	}
	l := d.Ledger
	if a.status != http.StatusUnprocessableEntity || problemType(a) != ordersapi.ProblemTypeBase+"idempotency-key-reused" {
		l.problem(&l.idem, "command %d: key %s reused with another body: %d %s, want a 422 idempotency-key-reused problem",
			c.Seq, c.Key, a.status, bytes.TrimSpace(a.body))
		return
	}
	l.set(c, func(c *Command) { c.KeyReusesRefused++ })
}

// sendSafe sends a request that is safe to repeat until it gets a
// definitive answer; it reports false when ctx ended first.
func (d *Driver) sendSafe(ctx context.Context, c *Command, method, path, key string, body any) (answer, bool) {
	for n := 1; ; n++ {
		a, class := d.send(ctx, method, path, key, body)
		if class != refused {
			d.Ledger.set(c, func(c *Command) { c.Requests++ })
		}
		if class == definitive {
			return a, true
		}
		if !retry(ctx, n) {
			return answer{}, false
		}
	}
}

func (d *Driver) cancel(ctx context.Context, c *Command) {
	l := d.Ledger
	for n := 1; ; n++ {
		a, class := d.send(ctx, http.MethodPost, "/orders/"+c.OrderID+"/cancel", "", nil)
		if class != refused {
			l.set(c, func(c *Command) { c.Requests++ })
		}
		if class == ambiguous {
			l.set(c, func(c *Command) { c.Outcome, c.AmbiguousAttempts = Ambiguous, c.AmbiguousAttempts+1 })
		}
		if class != definitive {
			if !retry(ctx, n) {
				return
			}
			continue
		}
		switch {
		case a.status == http.StatusOK && c.Kind == Cancel:
			l.set(c, func(c *Command) { c.Outcome = Committed; l.cancelled = append(l.cancelled, c.OrderID) })
		case a.status == http.StatusConflict && c.Kind == Cancel && c.AmbiguousAttempts > 0:
			// An earlier, unanswered attempt committed the cancellation.
			l.set(c, func(c *Command) { c.Outcome = Committed; l.cancelled = append(l.cancelled, c.OrderID) })
		case a.status == http.StatusConflict && c.Kind == CancelAgain:
			l.set(c, func(c *Command) { c.Outcome = Refused })
		default:
			l.problem(&l.problems, "command %d (%s of order %s): unexpected answer %d %s", c.Seq, c.Kind, c.OrderID, a.status, bytes.TrimSpace(a.body))
			l.set(c, func(c *Command) { c.Outcome = Ambiguous })
		}
		return
	}
}

// Resolve decides the commands left Ambiguous from the database: a create
// committed if an order with its customer id exists, a cancellation if the
// order is cancelled. Run it once everything has recovered.
func (l *Ledger) Resolve(ctx context.Context, pool *pgxpool.Pool, appSchema string) error {
	orders := pgx.Identifier{appSchema, "orders"}.Sanitize()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.cmds {
		if c.Outcome != Ambiguous {
			continue
		}
		c.ResolvedByDB = true
		switch c.Kind {
		case Create, Rollback:
			var id string
			err := pool.QueryRow(ctx, `SELECT order_id FROM `+orders+` WHERE customer_id = $1 LIMIT 1`, c.CustomerID).Scan(&id)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				c.Outcome = RolledBack
			case err != nil:
				return fmt.Errorf("resolve command %d: %w", c.Seq, err)
			default:
				c.Outcome, c.OrderID = Committed, id
			}
		default:
			var status string
			if err := pool.QueryRow(ctx, `SELECT status FROM `+orders+` WHERE order_id = $1`, c.OrderID).Scan(&status); err != nil {
				return fmt.Errorf("resolve command %d: %w", c.Seq, err)
			}
			c.Outcome = RolledBack
			if status == ordersapi.StatusCancelled && c.Kind == Cancel {
				c.Outcome = Committed
			}
			if c.Kind == CancelAgain {
				c.Outcome = Refused
			}
		}
	}
	return nil
}

// Problems returns the unexpected answers and the idempotency problems the
// client saw.
func (l *Ledger) Problems() (answers, idempotency []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.problems...), append([]string(nil), l.idem...)
}
