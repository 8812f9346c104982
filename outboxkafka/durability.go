package outboxkafka

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
)

var _ outbox.DurabilityChecker = (*Publisher)(nil)

// CheckDurability reports whether a record the cluster acknowledged
// survives the loss of a broker. It implements outbox.DurabilityChecker;
// the relay calls it at start.
//
// The publisher produces with acks=all (checked here on the client), so a
// record is acknowledged once every in-sync replica of its partition has
// it, in memory: Kafka does not fsync each record by default
// (flush.messages), it relies on replication. min.insync.replicas is how
// small the in-sync set may get before the leader refuses writes; at 1, the
// leader alone may acknowledge. So the acknowledgement is durable when
// every topic the relay writes to has a replication factor of at least 2
// and min.insync.replicas at least 2 (3 and 2 keep accepting writes with a
// broker down), or flush.messages=1 (the leader fsyncs each record), and
// unclean leader election is off.
//
// It checks the existing topics the template can name (every topic
// matching Config.Topic, "{aggregate_type}" standing for any name): their
// replication factor from the metadata, min.insync.replicas,
// unclean.leader.election.enable and flush.messages from DescribeConfigs.
// With no such topic yet it reports not durable, since there is nothing to
// check. It returns an error (marked outbox.Unavailable) only when the
// cluster could not be asked.
func (p *Publisher) CheckDurability(ctx context.Context) (outbox.DurabilityReport, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.DeliveryTimeout)
		defer cancel()
	}
	if acks, _ := p.client.OptValue(kgo.RequiredAcks).(kgo.Acks); acks != kgo.AllISRAcks() {
		// NewPublisher sets acks=all after the caller's options; this
		// only fires if that ever changes.
		return kafkaReport(false, "acks_not_all",
			"the producer does not wait for every in-sync replica: produce with acks=all"), nil
	}
	adm := kadm.NewClient(p.client) // not closed: that would close the publisher's client
	var details kadm.TopicDetails
	var err error
	if strings.Contains(p.cfg.Topic, AggregateTypePlaceholder) {
		details, err = adm.ListTopics(ctx)
	} else {
		details, err = adm.ListTopics(ctx, p.cfg.Topic)
	}
	if err != nil {
		return outbox.DurabilityReport{}, outbox.Unavailable(fmt.Errorf("outboxkafka: durability: list topics: %w", err))
	}
	match := topicPattern(p.cfg.Topic)
	var names []string
	rf := map[string]int{}
	for name, d := range details {
		if d.Err != nil || !match.MatchString(name) {
			continue
		}
		n := -1
		for _, pd := range d.Partitions {
			if n < 0 || len(pd.Replicas) < n {
				n = len(pd.Replicas)
			}
		}
		if n < 0 {
			continue // no partitions: nothing to write to
		}
		names = append(names, name)
		rf[name] = n
	}
	if len(names) == 0 {
		return kafkaReport(false, "no_topic",
			"no topic matching %s exists yet, so the relay could not check one: create the topics with replication factor 3 and min.insync.replicas=2 (the publisher does not create topics)", p.cfg.Topic), nil
	}
	sort.Strings(names)
	configs, err := adm.DescribeTopicConfigs(ctx, names...)
	if err != nil {
		return outbox.DurabilityReport{}, outbox.Unavailable(fmt.Errorf("outboxkafka: durability: describe topic configs: %w", err))
	}
	settings := map[string]topicSettings{}
	for _, rc := range configs {
		if rc.Err != nil {
			return outbox.DurabilityReport{}, fmt.Errorf("outboxkafka: durability: configs of topic %s: %w", rc.Name, rc.Err)
		}
		settings[rc.Name] = readTopicSettings(rc.Configs)
	}
	var bad []outbox.DurabilityReport
	var badTopics []string
	var good outbox.DurabilityReport
	goodHeld := 0
	for _, name := range names {
		s := settings[name]
		s.replicationFactor = rf[name]
		r := s.judge(name)
		if r.Durable {
			// Report the weakest: the fewest brokers holding an event.
			if held := min(s.minISR, s.replicationFactor); good.Reason == "" || held < goodHeld {
				good, goodHeld = r, held
			}
			continue
		}
		bad = append(bad, r)
		badTopics = append(badTopics, name)
	}
	if len(bad) == 0 {
		if len(names) > 1 {
			good.Summary = fmt.Sprintf("%d topics matching %s, the weakest: %s", len(names), p.cfg.Topic, good.Summary)
		}
		return good, nil
	}
	r := bad[0]
	if len(bad) > 1 {
		r.Summary += fmt.Sprintf(" (also not durable: %s)", strings.Join(badTopics[1:], ", "))
	}
	return r, nil
}

// topicSettings are what makes a topic's acknowledgements durable.
type topicSettings struct {
	replicationFactor int
	minISR            int
	unclean           bool
	flushMessages     int64 // 0: not known
}

// readTopicSettings reads the durability settings from a topic's configs
// (defaults where a broker does not report one).
func readTopicSettings(cs []kadm.Config) topicSettings {
	s := topicSettings{minISR: 1}
	for _, c := range cs {
		if c.Value == nil {
			continue
		}
		v := *c.Value
		switch c.Key {
		case "min.insync.replicas":
			if n, err := strconv.Atoi(v); err == nil {
				s.minISR = n
			}
		case "unclean.leader.election.enable":
			s.unclean = v == "true"
		case "flush.messages":
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				s.flushMessages = n
			}
		}
	}
	return s
}

// judge says whether an acknowledgement from the topic is durable.
func (s topicSettings) judge(topic string) outbox.DurabilityReport {
	held := min(s.minISR, s.replicationFactor)
	switch {
	case s.unclean:
		return kafkaReport(false, "unclean_leader_election",
			"topic %s allows unclean leader election (unclean.leader.election.enable=true): a replica that missed acknowledged events can become leader and drop them; set it to false", topic)
	case s.replicationFactor >= 2 && s.minISR >= 2:
		return kafkaReport(true, "replicated",
			"topic %s: replication factor %d, min.insync.replicas %d, acks=all: an acknowledged event is held by at least %d brokers", topic, s.replicationFactor, s.minISR, held)
	case s.flushMessages == 1:
		return kafkaReport(true, "flush_every_message",
			"topic %s: flush.messages=1: the leader fsyncs every event before acknowledging it (replication factor %d)", topic, s.replicationFactor)
	case s.replicationFactor <= 1:
		return kafkaReport(false, "replication_factor_1",
			"topic %s has replication factor 1: an acknowledged event is on one broker, not yet fsynced, and is lost with it; recreate the topic with replication factor 3 and min.insync.replicas=2", topic)
	default:
		return kafkaReport(false, "min_insync_replicas_1",
			"topic %s (replication factor %d) has min.insync.replicas=%d: with acks=all the leader alone may acknowledge an event and lose it; set min.insync.replicas=2", topic, s.replicationFactor, s.minISR)
	}
}

func kafkaReport(durable bool, reason, format string, args ...any) outbox.DurabilityReport {
	return outbox.DurabilityReport{Destination: "kafka", Durable: durable, Reason: reason, Summary: fmt.Sprintf(format, args...)}
}

// topicPattern matches the topic names a template can make.
func topicPattern(template string) *regexp.Regexp {
	parts := strings.Split(template, AggregateTypePlaceholder)
	for i := range parts {
		parts[i] = regexp.QuoteMeta(parts[i])
	}
	return regexp.MustCompile("^" + strings.Join(parts, "[a-zA-Z0-9._-]+") + "$")
}
