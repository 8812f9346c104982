package outboxamqp

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Placeholders of Config.RoutingKey.
const (
	// AggregateTypePlaceholder is replaced by the message's aggregate type.
	AggregateTypePlaceholder = "{aggregate_type}"
	// AggregateIDPlaceholder is replaced by the message's aggregate id.
	AggregateIDPlaceholder = "{aggregate_id}"
)

// RoutingKey returns the routing key of an event: template with every
// "{aggregate_type}" replaced by aggregateType and every "{aggregate_id}" by
// aggregateID, as they are. It returns an error when the result is not a
// valid AMQP routing key: valid UTF-8 of at most 255 bytes. Dots in the
// aggregate type or id add words to the key, as a topic exchange counts
// them.
func RoutingKey(template, aggregateType, aggregateID string) (string, error) {
	k := strings.ReplaceAll(template, AggregateTypePlaceholder, aggregateType)
	k = strings.ReplaceAll(k, AggregateIDPlaceholder, aggregateID)
	switch {
	case len(k) > maxShortString:
		return "", fmt.Errorf("routing key of %d bytes exceeds AMQP's %d", len(k), maxShortString)
	case !utf8.ValidString(k):
		return "", fmt.Errorf("routing key %q is not UTF-8", k)
	}
	return k, nil
}
