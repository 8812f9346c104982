package outboxkafka

import (
	"fmt"
	"strings"
)

// AggregateTypePlaceholder is replaced, in Config.Topic, by the message's
// aggregate type.
const AggregateTypePlaceholder = "{aggregate_type}"

// MaxTopicBytes is the longest topic name Kafka accepts.
const MaxTopicBytes = 249

// Topic returns the topic of an aggregate type's events: template with every
// "{aggregate_type}" replaced by aggregateType, as it is. It returns an error
// when the result is not a valid Kafka topic name: 1 to 249 characters out of
// [a-zA-Z0-9._-], and neither "." nor "..".
func Topic(template, aggregateType string) (string, error) {
	t := strings.ReplaceAll(template, AggregateTypePlaceholder, aggregateType)
	if err := validTopic(t); err != nil {
		return "", fmt.Errorf("aggregate type %q: %w", aggregateType, err)
	}
	return t, nil
}

func validTopic(t string) error {
	switch {
	case t == "":
		return fmt.Errorf("empty topic name")
	case t == "." || t == "..":
		return fmt.Errorf("topic name %q is reserved", t)
	case len(t) > MaxTopicBytes:
		return fmt.Errorf("topic name of %d bytes exceeds Kafka's %d", len(t), MaxTopicBytes)
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic name %q: Kafka allows only [a-zA-Z0-9._-]", t)
		}
	}
	return nil
}
