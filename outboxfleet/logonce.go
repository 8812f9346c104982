package outboxfleet

// One log line per destination for what every source's relay logs alike:
// each relay checks its destination's acknowledgement at start and logs the
// result, so 200 sources routed to one stream wrote the same "not durable"
// warning 200 times. The fleet's sources share a handler that passes the
// first such line for a (message, destination, reason, detail) and drops
// the others; each relay still records its result in its heartbeat row
// (`outbox status`) and metric.

import (
	"context"
	"log/slog"
	"strings"
	"sync"
)

// onceLines is the state the sources' handlers share.
type onceLines struct {
	mu   sync.Mutex
	seen map[string]bool
}

// first reports whether key is seen for the first time.
func (o *onceLines) first(key string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen[key] {
		return false
	}
	if o.seen == nil {
		o.seen = map[string]bool{}
	}
	o.seen[key] = true
	return true
}

// onceHandler passes the first record of each destination acknowledgement
// finding and drops its repeats.
type onceHandler struct {
	slog.Handler
	once *onceLines
}

// sameForEverySource is the prefix of the relay's log messages that say the
// same for every source of a destination (relay_durability.go, noteAck).
const sameForEverySource = "destination acknowledgement "

func (h onceHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, sameForEverySource) {
		var key strings.Builder
		key.WriteString(r.Message)
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "destination", "reason", "detail":
				key.WriteString("\x00" + a.Key + "=" + a.Value.String())
			}
			return true
		})
		if !h.once.first(key.String()) {
			return nil
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h onceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return onceHandler{Handler: h.Handler.WithAttrs(as), once: h.once}
}

func (h onceHandler) WithGroup(name string) slog.Handler {
	return onceHandler{Handler: h.Handler.WithGroup(name), once: h.once}
}
