package main

// outbox asyncapi: the wire contract of what a relay publishes, as an
// AsyncAPI 3.0 document that code generators, catalogues and validators
// read: per destination binding, where events go (subject, topic, routing
// key, webhook URL), the CloudEvents attributes a message carries (header or
// property names from the destination packages themselves), the payload, the
// dedup key and the ordering key. TestAsyncAPIValidates checks it with the
// npm @asyncapi/parser.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/outboxamqp"
	"github.com/pgoutbox/outbox/outboxkafka"
	"github.com/pgoutbox/outbox/outboxnats"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

func runAsyncAPI(_ context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "asyncapi", "asyncapi [--destination URL] [--title T] [--version V]")
	dest := fs.String("destination", "", "describe only this destination, with its URL's options (stream, subject prefix, topic, exchange, routing key, source, webhook mode); credentials are never printed. Default: every destination binding, at its defaults")
	title := fs.String("title", "outbox events", "the document's info.title")
	version := fs.String("version", "1.0.0", "the document's info.version (your API's version)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	doc, err := asyncAPIDocument(*dest, *title, *version)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(doc)
}

type obj = map[string]any

// ceAttribute is a CloudEvents attribute as the messages carry it.
type ceAttribute struct {
	name, description string
	required          bool
}

// ceAttributes in the order the docs list them (docs/destinations.md).
var ceAttributes = []ceAttribute{
	{"specversion", "CloudEvents version: 1.0", true},
	{"id", "the event id (UUIDv7 unless the writer gave one): the dedup key", true},
	{"source", "the relay's --source", true},
	{"type", "the event type", true},
	{"subject", "the aggregate id: with aggregatetype, the ordering key (in headers, percent-encoded where needed: decode before use)", true},
	{"time", "when the event occurred (the writer's transaction start), RFC 3339, UTC", true},
	{"aggregatetype", "the aggregate type", true},
	{"sequence", "the event's sequence within its aggregate, 1, 2, 3, ... as 20 zero-padded digits; apply in this order (the SQL inbox: inbox_claim)", true},
	{"schemaversion", "the payload's schema version", true},
	{"skippedfrom", "present only when an operator skipped the events just before this one: sequences skippedfrom ... sequence-1 will never come", false},
	{"replayid", "present only on a replayed copy: the replay operation", false},
}

// headerSchema is the JSON Schema of a message's headers: the CloudEvents
// attributes named by name(attr), and extra headers.
func headerSchema(name func(string) string, extra obj, skip ...string) obj {
	props, required := obj{}, []string{}
next:
	for _, a := range ceAttributes {
		for _, s := range skip {
			if a.name == s {
				continue next
			}
		}
		props[name(a.name)] = obj{"type": "string", "description": a.description}
		if a.required {
			required = append(required, name(a.name))
		}
	}
	for k, v := range extra {
		props[k] = v
	}
	return obj{"type": "object", "properties": props, "required": required}
}

const (
	orderingNote = "Events of one aggregate (aggregatetype, subject) are published in sequence order, each after the previous one was acknowledged (Kafka: in one ordered pipeline); across aggregates there is no order. Delivery is at least once: drop copies by id, apply in order by sequence."
	payloadNote  = "The event's payload, byte for byte as written; its content type is the message's."
)

// asyncAPIDocument is the document for dest ("": every binding at its
// defaults).
func asyncAPIDocument(dest, title, version string) (obj, error) {
	servers, channels, operations, messages := obj{}, obj{}, obj{}, obj{}
	kind := ""
	if dest != "" {
		u, err := url.Parse(dest)
		if err != nil {
			return nil, errors.New("--destination (not shown: it may hold credentials): not a URL")
		}
		kind = u.Scheme
	}
	opBindings := obj{
		"amqp":    obj{"amqp": obj{"deliveryMode": 2, "mandatory": true, "bindingVersion": "0.3.0"}},
		"webhook": obj{"http": obj{"method": "POST", "bindingVersion": "0.3.0"}},
	}
	add := func(name string, server, channel, message obj) {
		if server != nil {
			servers[name] = server
			channel["servers"] = []any{obj{"$ref": "#/servers/" + name}}
		}
		messages[name+"Event"] = message
		channel["messages"] = obj{"event": obj{"$ref": "#/components/messages/" + name + "Event"}}
		channels[name] = channel
		op := obj{
			"action":      "send",
			"summary":     "The relay publishes each committed event once it is the next of its aggregate, and marks it published only after the destination's acknowledgement.",
			"channel":     obj{"$ref": "#/channels/" + name},
			"messages":    []any{obj{"$ref": "#/channels/" + name + "/messages/event"}},
			"description": orderingNote,
		}
		if b, ok := opBindings[name]; ok {
			op["bindings"] = b
		}
		operations["publish"+strings.ToUpper(name[:1])+name[1:]] = op
	}
	param := obj{"aggregateType": obj{"description": "the event's aggregate type"}}
	matched := false
	switch kind {
	case "", "nats", "tls":
		cfg := outboxnats.Config{Stream: outboxnats.StreamDefault, SubjectPrefix: outboxnats.SubjectPrefixDefault, Source: outboxnats.SourceDefault}
		var server obj
		if kind != "" {
			s, c, err := outboxnats.ParseURL(dest)
			if err != nil {
				return nil, badDestination(err)
			}
			cfg = c
			cfg.Stream, cfg.SubjectPrefix, cfg.Source = or(cfg.Stream, outboxnats.StreamDefault), or(cfg.SubjectPrefix, outboxnats.SubjectPrefixDefault), or(cfg.Source, outboxnats.SourceDefault)
			server = obj{"host": hostsOf(s), "protocol": "nats", "description": "JetStream stream " + cfg.Stream}
		}
		h := func(a string) string { return "ce-" + a }
		add("nats", server, obj{
			"address":     cfg.SubjectPrefix + ".{aggregateType}.{aggregateId}",
			"description": "One JetStream stream (" + cfg.Stream + ") covering " + cfg.SubjectPrefix + ".>; the subject's tokens are the aggregate type and id, escaped (outboxnats.Subject).",
			"parameters":  obj{"aggregateType": param["aggregateType"], "aggregateId": obj{"description": "the event's aggregate id"}},
		}, obj{
			"name": "OutboxEvent", "title": "An outbox event (CloudEvents 1.0, binary mode: ce- headers)",
			"contentType":           "application/json",
			"headers":               headerSchema(h, obj{"ce-partitionkey": obj{"type": "string", "description": "the aggregate id"}, outboxnats.HeaderMsgID: obj{"type": "string", "description": "the event id (a replayed copy: <id>:<replay id>): JetStream's dedup key"}, "traceparent": obj{"type": "string", "description": "W3C trace context of the relay's publish span, when the event carries one"}}),
			"payload":               obj{"description": payloadNote},
			"correlationId":         obj{"location": "$message.header#/ce-id"},
			"x-outbox-source":       cfg.Source,
			"x-outbox-ordering-key": "ce-aggregatetype + ce-subject",
		})
		matched = true
	}
	switch kind {
	case "", "kafka", "kafkas":
		cfg := outboxkafka.Config{Topic: outboxkafka.TopicDefault, Source: outboxkafka.SourceDefault}
		var server obj
		if kind != "" {
			c, err := outboxkafka.ParseURL(dest)
			if err != nil {
				return nil, badDestination(err)
			}
			cfg = c
			cfg.Topic, cfg.Source = or(cfg.Topic, outboxkafka.TopicDefault), or(cfg.Source, outboxkafka.SourceDefault)
			server = obj{"host": strings.Join(cfg.Brokers, ","), "protocol": "kafka"}
		}
		h := func(a string) string { return "ce_" + a }
		add("kafka", server, obj{
			"address":     strings.ReplaceAll(cfg.Topic, outboxkafka.AggregateTypePlaceholder, "{aggregateType}"),
			"description": "The topic template " + cfg.Topic + "; the record key is the aggregate id, so an aggregate's events share a partition.",
			"parameters":  param,
		}, obj{
			"name": "OutboxEvent", "title": "An outbox event (CloudEvents 1.0, binary mode: ce_ headers)",
			"contentType":           "application/json",
			"headers":               headerSchema(h, obj{"content-type": obj{"type": "string"}, "traceparent": obj{"type": "string", "description": "W3C trace context, when the event carries one"}}),
			"payload":               obj{"description": payloadNote},
			"correlationId":         obj{"location": "$message.header#/ce_id"},
			"bindings":              obj{"kafka": obj{"key": obj{"type": "string", "description": "the aggregate id: the ordering and partitioning key"}, "bindingVersion": "0.5.0"}},
			"x-outbox-source":       cfg.Source,
			"x-outbox-ordering-key": "the record key (the aggregate id) within the topic of its aggregate type",
		})
		matched = true
	}
	switch kind {
	case "", "amqp", "amqps":
		cfg := outboxamqp.Config{Exchange: outboxamqp.ExchangeDefault, RoutingKey: outboxamqp.RoutingKeyDefault, Source: outboxamqp.SourceDefault}
		var server obj
		if kind != "" {
			c, err := outboxamqp.ParseURL(dest)
			if err != nil {
				return nil, badDestination(err)
			}
			cfg = c
			cfg.Exchange, cfg.RoutingKey, cfg.Source = or(cfg.Exchange, outboxamqp.ExchangeDefault), or(cfg.RoutingKey, outboxamqp.RoutingKeyDefault), or(cfg.Source, outboxamqp.SourceDefault)
			u, _ := url.Parse(dest)
			server = obj{"host": u.Host, "protocol": u.Scheme, "pathname": or(u.Path, "/")}
		}
		h := func(a string) string { return "cloudEvents:" + a }
		add("amqp", server, obj{
			"address":     strings.ReplaceAll(cfg.RoutingKey, outboxamqp.AggregateTypePlaceholder, "{aggregateType}"),
			"description": "The routing key template " + cfg.RoutingKey + " on the topic exchange " + cfg.Exchange + "; bind a queue per consumer.",
			"parameters":  param,
			"bindings":    obj{"amqp": obj{"is": "routingKey", "exchange": obj{"name": cfg.Exchange, "type": "topic", "durable": true, "autoDelete": false}, "bindingVersion": "0.3.0"}},
		}, obj{
			"name": "OutboxEvent", "title": "An outbox event (CloudEvents 1.0, binary mode: cloudEvents: application properties)",
			"contentType":           "application/json",
			"headers":               headerSchema(h, obj{"traceparent": obj{"type": "string", "description": "W3C trace context, when the event carries one"}}),
			"payload":               obj{"description": payloadNote},
			"correlationId":         obj{"location": "$message.header#/cloudEvents:id"},
			"bindings":              obj{"amqp": obj{"messageType": "outbox event", "bindingVersion": "0.3.0"}},
			"x-outbox-source":       cfg.Source,
			"x-outbox-dedup-key":    "message-id (the event id)",
			"x-outbox-ordering-key": "cloudEvents:aggregatetype + cloudEvents:subject",
		})
		matched = true
	}
	switch kind {
	case "", "http", "https":
		cfg := outboxwebhook.Config{Source: outboxwebhook.SourceDefault, Mode: outboxwebhook.Structured}
		var server obj
		if kind != "" {
			c, err := outboxwebhook.ParseURL(dest)
			if err != nil {
				return nil, badDestination(err)
			}
			cfg = c
			cfg.Source = or(cfg.Source, outboxwebhook.SourceDefault)
			if cfg.Mode == "" {
				cfg.Mode = outboxwebhook.Structured
			}
			u, _ := url.Parse(cfg.URL)
			server = obj{"host": u.Host, "protocol": u.Scheme}
		}
		signing := obj{
			outboxwebhook.HeaderWebhookID:        obj{"type": "string", "description": "the event id; a replayed copy: <id>:<replay id> (Standard Webhooks)"},
			outboxwebhook.HeaderWebhookTimestamp: obj{"type": "string", "description": "seconds since the epoch (Standard Webhooks)"},
			outboxwebhook.HeaderWebhookSignature: obj{"type": "string", "description": "v1,<base64 HMAC-SHA256> per secret (Standard Webhooks); verify before use"},
			outboxwebhook.HeaderIdempotencyKey:   obj{"type": "string", "description": "the event id (a replayed copy: <id>:<replay id>)"},
		}
		msg := obj{"name": "OutboxEvent", "correlationId": obj{"location": "$message.header#/" + outboxwebhook.HeaderWebhookID},
			"x-outbox-source":       cfg.Source,
			"x-outbox-ordering-key": "aggregatetype + subject"}
		if cfg.Mode == outboxwebhook.Binary {
			h := func(a string) string { return "ce-" + a }
			msg["title"] = "An outbox event (CloudEvents 1.0, binary mode: ce- headers), signed"
			msg["contentType"] = "application/json"
			msg["headers"] = headerSchema(h, signing)
			msg["payload"] = obj{"description": payloadNote}
		} else {
			props := obj{"data": obj{"description": "a JSON payload as written"}, "data_base64": obj{"type": "string", "description": "any other payload, base64"},
				"datacontenttype": obj{"type": "string"}, "partitionkey": obj{"type": "string", "description": "the aggregate id"},
				"outboxheaders": obj{"type": "string", "description": "the event's own headers as a JSON object in a string, when it has any"}}
			required := []string{}
			for _, a := range ceAttributes {
				props[a.name] = obj{"type": "string", "description": a.description}
				if a.required {
					required = append(required, a.name)
				}
			}
			msg["title"] = "An outbox event (CloudEvents 1.0, structured mode: one signed JSON body)"
			msg["contentType"] = "application/cloudevents+json"
			msg["headers"] = obj{"type": "object", "properties": signing, "required": []string{outboxwebhook.HeaderWebhookID, outboxwebhook.HeaderWebhookTimestamp, outboxwebhook.HeaderWebhookSignature}}
			msg["payload"] = obj{"type": "object", "properties": props, "required": required}
		}
		// The address is the endpoint's path, which is not printed: a
		// webhook path often holds a secret (a token in the URL).
		add("webhook", server, obj{"address": nil, "description": "One signed POST per event to the relay's --destination URL (its path is not printed here: webhook paths often hold a token); a 2xx answer is the acknowledgement."}, msg)
		matched = true
	}
	if !matched {
		return nil, fmt.Errorf("--destination (not shown: it may hold credentials): scheme %q: want nats, tls, kafka, kafkas, amqp, amqps, http or https", kind)
	}
	doc := obj{
		"asyncapi": "3.0.0",
		"info": obj{"title": title, "version": version,
			"description": "What an outbox relay publishes: one message per committed event, CloudEvents 1.0. " + orderingNote +
				" Generated by `outbox asyncapi` (docs/destinations.md has every attribute and option)."},
		"defaultContentType": "application/json",
		"channels":           channels,
		"operations":         operations,
		"components":         obj{"messages": messages},
	}
	if len(servers) > 0 {
		doc["servers"] = servers
	}
	return doc, nil
}

// badDestination is the error for a --destination its package refused: the
// package's own, which names what is wrong without any secret of the URL
// (a URL in which a password or token may have spilled past the host part
// is not shown at all).
func badDestination(err error) error {
	return fmt.Errorf("--destination: %w", err)
}

// hostsOf is a NATS server URL's hosts, each without its credentials or
// scheme.
func hostsOf(server string) string {
	_, rest, _ := strings.Cut(server, "://")
	hosts := strings.Split(rest, ",")
	for i, h := range hosts {
		h = strings.TrimSpace(h)
		if _, after, ok := strings.Cut(h, "://"); ok {
			h = after
		}
		if j := strings.LastIndex(h, "@"); j >= 0 {
			h = h[j+1:]
		}
		hosts[i] = h
	}
	return strings.Join(hosts, ",")
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
