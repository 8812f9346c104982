package outboxamqp

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox"
)

var _ outbox.DurabilityChecker = (*Publisher)(nil)

// maxQueueProbes bounds the re-declarations that learn one queue's type.
const maxQueueProbes = 8

// CheckDurability reports whether a message the broker confirmed survives
// the loss of the node that confirmed it. It implements
// outbox.DurabilityChecker; the relay calls it at start.
//
// The publisher sends every message persistent, mandatory, on a channel in
// confirm mode, so RabbitMQ confirms it once every queue it was routed to
// has it: a quorum queue once a majority of its replicas have written and
// fsynced it, a durable classic queue once it is on that node's disk; a
// stream once a quorum of replicas have it, without fsync; a transient
// (non-durable), auto-delete or exclusive queue only keeps it until the
// broker restarts or its consumer or connection goes. What counts is the
// queues bound to the exchange, which AMQP 0-9-1 cannot list: the
// publisher inspects the queues named in Config.CheckQueues, and reports
// not durable, saying so, when none are named.
//
// A queue's properties are not visible either, only their mismatch: after
// a passive declare (does it exist?), CheckDurability declares it again
// as durable with x-queue-type quorum, which succeeds only for a durable
// quorum queue, and otherwise fails naming the first property that differs
// (durable, auto_delete, x-queue-type, or an argument such as a TTL, which
// it then copies and declares again). The declarations change nothing on
// an existing queue, but need the configure permission on it; a queue
// deleted between the passive declare and the next would be created, as a
// quorum queue.
//
// It returns an error (marked outbox.Unavailable when the broker cannot be
// reached) only when the broker could not be asked.
func (p *Publisher) CheckDurability(ctx context.Context) (outbox.DurabilityReport, error) {
	if len(p.cfg.CheckQueues) == 0 {
		return amqpReport(false, "queues_unchecked",
			"the relay cannot see which queues exchange %s routes to (AMQP 0-9-1 cannot list bindings): name them in check_queues=q1,q2 so that it can check they are quorum or durable queues", p.cfg.Exchange), nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.ConfirmTimeout)
		defer cancel()
	}
	p.mu.Lock()
	err := p.connectLocked(ctx)
	conn := p.conn
	p.mu.Unlock()
	if err != nil {
		return outbox.DurabilityReport{}, err
	}
	var bad []outbox.DurabilityReport
	var badNames []string
	allQuorum := true
	var good []string
	for _, q := range p.cfg.CheckQueues {
		k, detail, err := p.inspectQueue(ctx, conn, q)
		if err != nil {
			return outbox.DurabilityReport{}, err
		}
		r := k.judge(q, detail)
		if !r.Durable {
			bad = append(bad, r)
			badNames = append(badNames, q)
			continue
		}
		allQuorum = allQuorum && k == queueQuorum
		good = append(good, r.Summary)
	}
	if len(bad) > 0 {
		r := bad[0]
		if len(bad) > 1 {
			r.Summary += fmt.Sprintf(" (also not durable: %s)", strings.Join(badNames[1:], ", "))
		}
		return r, nil
	}
	reason := "durable_queues"
	if allQuorum {
		reason = "quorum_queues"
	}
	return amqpReport(true, reason, "%s; every message persistent, confirmed", strings.Join(good, "; ")), nil
}

// queueKind is what the probes learnt about a queue.
type queueKind int

const (
	queueQuorum       queueKind = iota
	queueClassic                // durable classic queue
	queueDurable                // durable, not auto-delete, type not learnt
	queueStream                 // a stream
	queueTransient              // durable=false
	queueAutoDelete             // auto_delete=true
	queueExclusive              // exclusive to another connection
	queueMissing                // does not exist
	queueNotInspected           // the broker refused the probes (permissions)
)

func (k queueKind) judge(q, detail string) outbox.DurabilityReport {
	switch k {
	case queueQuorum:
		return amqpReport(true, "quorum_queues", "queue %s is a quorum queue (a confirm: fsynced by a majority of its replicas)", q)
	case queueClassic:
		return amqpReport(true, "durable_queues", "queue %s is a durable classic queue (a confirm: fsynced on its node)", q)
	case queueDurable:
		return amqpReport(true, "durable_queues", "queue %s is durable (its type could not be learnt: %s)", q, detail)
	case queueStream:
		return amqpReport(false, "stream_queue",
			"queue %s is a stream, which confirms once a quorum of its replicas have an event but never fsyncs it: on one node a power loss loses confirmed events, and the relay cannot see its replica count; bind a quorum queue (x-queue-type: quorum) instead", q)
	case queueTransient:
		return amqpReport(false, "queue_not_durable",
			"queue %s is not durable (durable: false): a broker restart deletes it and the events in it; declare it durable, as a quorum queue (x-queue-type: quorum)", q)
	case queueAutoDelete:
		return amqpReport(false, "queue_auto_delete",
			"queue %s is auto-delete: it goes, with the events in it, when its last consumer does; declare it without auto-delete, as a quorum queue (x-queue-type: quorum)", q)
	case queueExclusive:
		return amqpReport(false, "queue_exclusive",
			"queue %s is exclusive to another connection and goes with it; bind a durable quorum queue (x-queue-type: quorum) instead", q)
	case queueMissing:
		return amqpReport(false, "queue_missing",
			"queue %s (check_queues) does not exist: declare it, durable, as a quorum queue (x-queue-type: quorum), and bind it, or fix check_queues", q)
	default:
		return amqpReport(false, "queue_unchecked",
			"queue %s could not be inspected (%s): the relay's user needs the configure permission on it, or leave it out of check_queues", q, detail)
	}
}

func amqpReport(durable bool, reason, format string, args ...any) outbox.DurabilityReport {
	return outbox.DurabilityReport{Destination: "amqp", Durable: durable, Reason: reason, Summary: fmt.Sprintf(format, args...)}
}

// inspectQueue learns what queue q is (see CheckDurability), each probe on a
// channel of its own: a failed declare closes its channel.
func (p *Publisher) inspectQueue(ctx context.Context, conn *amqp.Connection, q string) (queueKind, string, error) {
	// declare returns the broker's refusal of the declaration (nil when it
	// succeeded), or an error when the broker could not be asked.
	declare := func(passive bool, args amqp.Table) (*amqp.Error, error) {
		var refused *amqp.Error
		err := rpc(ctx, conn, func() error {
			ch, err := conn.Channel()
			if err != nil {
				return err
			}
			if passive {
				_, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
			} else {
				_, err = ch.QueueDeclare(q, true, false, false, false, args)
			}
			if err == nil {
				return ch.Close()
			}
			var e *amqp.Error
			if errors.As(err, &e) && e.Server {
				switch e.Code {
				case amqp.AccessRefused, amqp.NotFound, amqp.ResourceLocked, amqp.PreconditionFailed:
					refused = e // the broker answered, closing the channel
					return nil
				}
			}
			_ = ch.Close()
			return err
		})
		if err != nil {
			return nil, p.unavailable(fmt.Errorf("inspect queue %q: %w", q, err))
		}
		return refused, nil
	}
	refused, err := declare(true, nil)
	switch {
	case err != nil:
		return 0, "", err
	case refused == nil:
	case refused.Code == amqp.NotFound:
		return queueMissing, "", nil
	case refused.Code == amqp.ResourceLocked:
		return queueExclusive, "", nil
	default:
		return queueNotInspected, refused.Reason, nil
	}
	args := amqp.Table{"x-queue-type": "quorum"}
	last := ""
	for range maxQueueProbes {
		refused, err := declare(false, args)
		if err != nil {
			return 0, "", err
		}
		if refused == nil {
			if t, _ := args["x-queue-type"].(string); t == "quorum" {
				return queueQuorum, "", nil
			}
			return queueDurable, "declared as " + fmt.Sprint(args["x-queue-type"]), nil
		}
		if refused.Code != amqp.PreconditionFailed {
			return queueNotInspected, refused.Reason, nil
		}
		last = refused.Reason
		m := inequivalentRE.FindStringSubmatch(refused.Reason)
		if m == nil {
			return queueDurable, last, nil
		}
		arg, current := m[1], m[2]
		switch arg {
		case "durable":
			return queueTransient, "", nil
		case "auto_delete":
			return queueAutoDelete, "", nil
		case "x-queue-type":
			// durable and auto_delete, checked before the arguments, match.
			switch v, _ := currentValue(current); v {
			case nil, "classic":
				return queueClassic, "", nil
			case "stream":
				return queueStream, "", nil
			default:
				return queueDurable, "x-queue-type " + fmt.Sprint(v), nil
			}
		}
		v, ok := currentValue(current)
		if !ok {
			return queueDurable, last, nil
		}
		if v == nil {
			delete(args, arg)
		} else {
			args[arg] = v
		}
	}
	return queueDurable, last, nil
}

// inequivalentRE reads RabbitMQ's PRECONDITION_FAILED for a redeclaration:
// "inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received none
// but current is the value '100' of type 'signedint'".
var inequivalentRE = regexp.MustCompile(`inequivalent arg '([^']+)' for queue .*: received .* but current is (.*)$`)

// currentValueRE reads the "current is ..." part: "none", "'V'" or "the
// value 'V' of type 'T'".
var currentValueRE = regexp.MustCompile(`^(?:the value '(.*)' of type '([a-z]+)'|'(.*)')$`)

// currentValue returns the queue's current value of an argument as an AMQP
// table value (nil for none), and false when it cannot be read.
func currentValue(s string) (any, bool) {
	if s == "none" {
		return nil, true
	}
	m := currentValueRE.FindStringSubmatch(s)
	if m == nil {
		return nil, false
	}
	if m[2] == "" {
		return m[3], true // same type as what was sent: a string here
	}
	v, typ := m[1], m[2]
	switch typ {
	case "longstr":
		return v, true
	case "bool":
		b, err := strconv.ParseBool(v)
		return b, err == nil
	case "signedint":
		n, err := strconv.ParseInt(v, 10, 32)
		return int32(n), err == nil
	case "long":
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil
	case "short":
		n, err := strconv.ParseInt(v, 10, 16)
		return int16(n), err == nil
	case "double", "float":
		f, err := strconv.ParseFloat(v, 64)
		return f, err == nil
	}
	return nil, false
}
