package outboxwebhook_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// replayRig is a receiver whose clock the test sets, counting handle calls
// per event.
type replayRig struct {
	t      *testing.T
	secret string
	srv    *httptest.Server
	mu     sync.Mutex
	now    time.Time
	step   time.Duration // added to the clock after each reading
	calls  map[uuid.UUID]int
}

func newReplayRig(t *testing.T, remember int) *replayRig {
	rg := &replayRig{t: t, secret: newSecret(t), now: time.Unix(1_800_000_000, 0), calls: map[uuid.UUID]int{}}
	rc, err := outboxwebhook.NewReceiver([]string{rg.secret}, func(_ context.Context, m outbox.Message) error {
		rg.mu.Lock()
		defer rg.mu.Unlock()
		rg.calls[m.ID]++
		return nil
	}, outboxwebhook.ReceiverOptions{Remember: remember, Now: func() time.Time {
		rg.mu.Lock()
		defer rg.mu.Unlock()
		t := rg.now
		rg.now = rg.now.Add(rg.step)
		return t
	}})
	if err != nil {
		t.Fatal(err)
	}
	rg.srv = httptest.NewServer(rc)
	t.Cleanup(rg.srv.Close)
	return rg
}

func (rg *replayRig) setClock(at time.Time, step time.Duration) {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	rg.now, rg.step = at, step
}

// capture returns the request a publisher sends for m at ts, as bytes that
// can be sent again.
func (rg *replayRig) capture(m outbox.Message, ts time.Time) captured {
	req := signedRequest(rg.t, rg.srv.URL, []string{rg.secret}, "", m, ts, nil)
	body, _ := io.ReadAll(req.Body)
	return captured{header: req.Header, body: body}
}

func (rg *replayRig) send(c captured) int {
	req, err := http.NewRequest(http.MethodPost, rg.srv.URL, bytes.NewReader(c.body))
	if err != nil {
		rg.t.Fatal(err)
	}
	req.Header = c.header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		rg.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (rg *replayRig) handled(id uuid.UUID) int {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	return rg.calls[id]
}

// Security review of issue 19, item 8: the memory of handled deliveries
// keeps an id at least as long as its timestamp is acceptable, so a
// captured request replayed within the tolerance never reaches handle a
// second time: not when the clock ticks between the timestamp check and
// the memory's clean-up, not when the clock steps back, and not when the
// memory is full (it refuses, 503, rather than forget an id still
// acceptable). Before the fix each of the three handled the replay again.
func TestReplayMemoryHoldsWhileAcceptable(t *testing.T) {
	t.Parallel()
	tol := outboxwebhook.ToleranceDefault

	t.Run("clock ticks during the request", func(t *testing.T) {
		t.Parallel()
		rg := newReplayRig(t, 0)
		m := message("o-1", 1)
		ts := rg.now
		c := rg.capture(m, ts)
		if code := rg.send(c); code != http.StatusNoContent {
			t.Fatalf("first delivery: %d", code)
		}
		// The last second the timestamp is acceptable; the clock moves on
		// by a second each time it is read.
		rg.setClock(ts.Add(tol), time.Second)
		code := rg.send(c)
		if n := rg.handled(m.ID); n != 1 || code != http.StatusNoContent {
			t.Fatalf("a replay at the edge of the tolerance: %d, handle ran %d times; want 204 (handled before), once", code, n)
		}
	})

	t.Run("clock steps back", func(t *testing.T) {
		t.Parallel()
		rg := newReplayRig(t, 0)
		m := message("o-1", 1)
		ts := rg.now
		c := rg.capture(m, ts)
		if code := rg.send(c); code != http.StatusNoContent {
			t.Fatalf("first delivery: %d", code)
		}
		// The clock runs past the tolerance (another delivery then makes
		// the memory forget the first), then steps back (NTP) into it.
		later := ts.Add(tol + 10*time.Second)
		rg.setClock(later, 0)
		if code := rg.send(rg.capture(message("o-2", 1), later)); code != http.StatusNoContent {
			t.Fatalf("another delivery: %d", code)
		}
		rg.setClock(ts.Add(tol-5*time.Second), 0)
		code := rg.send(c)
		if n := rg.handled(m.ID); n != 1 {
			t.Fatalf("a replay after the clock stepped back: %d, handle ran %d times, want once", code, n)
		}
	})

	t.Run("memory full", func(t *testing.T) {
		t.Parallel()
		rg := newReplayRig(t, 2)
		ts := rg.now
		var first captured
		var firstID uuid.UUID
		for i := range 3 {
			m := message("o-1", int64(i+1))
			c := rg.capture(m, ts.Add(time.Duration(i)*time.Second))
			if i == 0 {
				first, firstID = c, m.ID
			}
			if code := rg.send(c); code != http.StatusNoContent {
				t.Fatalf("delivery %d: %d", i, code)
			}
		}
		code := rg.send(first)
		if n := rg.handled(firstID); n != 1 {
			t.Fatalf("a replay of a delivery the full memory dropped: %d, handle ran %d times, want once", code, n)
		}
		if code != http.StatusServiceUnavailable {
			t.Errorf("a replay the memory cannot vouch for: %d, want 503", code)
		}
		// A delivery newer than the one forgotten is handled.
		m := message("o-1", 4)
		if code := rg.send(rg.capture(m, ts.Add(10*time.Second))); code != http.StatusNoContent {
			t.Fatalf("a newer delivery with the memory full: %d, want 204", code)
		}
	})
}
