// Package outboxwebhook is the HTTP webhook destination of the outbox: a
// [Publisher] that POSTs each event the relay hands it to one endpoint, a
// [Receiver] (an http.Handler) for services that take those requests, and
// [Decode] and [Verify] for receivers written by hand. It uses only the
// standard library. Use it from Go with outbox.NewRelay, or run
// "outbox relay --destination https://host/path" (and "outbox replay"
// likewise) with the secret in OUTBOX_WEBHOOK_SECRET.
//
// # Destination URL
//
// [ParseURL] reads the URL form "outbox relay --destination" takes:
//
//	https://hooks.example.com/outbox?key=abc&outbox_timeout=5s&outbox_ca_file=/etc/outbox/ca.pem
//
// The URL is the endpoint itself, http:// or https://. Query parameters
// whose name starts with "outbox_" are options and are removed from the URL
// the requests go to, so they never collide with the endpoint's own query
// (key=abc above is sent as it is):
//
//	outbox_source              CloudEvents source (default /outbox; else --source)
//	outbox_mode                structured (default) or binary (see Request format)
//	outbox_timeout             bound of one request (default 10s)
//	outbox_concurrency         requests in flight per Publish call (default 16)
//	outbox_max_response_bytes  most of a response body read (default 64 KiB)
//	outbox_ca_file             PEM CAs trusted instead of the system's
//	outbox_cert_file, outbox_key_file   PEM client certificate and key (mutual TLS)
//
// Unknown outbox_ parameters, fragments and credentials in the URL are
// refused. The signing secrets never go in the URL: they come from
// Config.Secrets or the OUTBOX_WEBHOOK_SECRET environment variable. Errors
// (and so an event's last_error), logs and String() show the endpoint as
// scheme://host/xxxxx only, because the path (Slack and Discord put a
// token there) and the query may hold the endpoint's secret; secrets are
// never printed.
//
// # Request format
//
// Each event is one POST, a CloudEvents 1.0 event in one of the HTTP
// binding's two content modes (Config.Mode, or outbox_mode in the URL):
//
// Structured mode, the default: the body is the event as one JSON object
// (the CloudEvents JSON format), Content-Type application/cloudevents+json.
// Its members are specversion "1.0", id (event id), type (event type),
// source (Config.Source), subject (aggregate id), time (occurred_at, RFC
// 3339 UTC with nanoseconds), datacontenttype (the event's content type,
// application/json unless it has another), and the extensions
// aggregatetype, sequence (aggregate_sequence as 20 zero-padded digits),
// schemaversion, partitionkey (aggregate id), skippedfrom when events just
// before this one were skipped by an operator, replayid on a replayed event
// (see outbox.Message), and outboxheaders (the event's own headers,
// traceparent and the like, as a JSON object in a JSON string) when it has
// any: the names outboxnats and outboxkafka use, all of them strings. A
// JSON payload is the member "data" byte for byte (not re-encoded) when it
// is one JSON value in UTF-8 without white space around it; any other
// payload is "data_base64" (standard base64); an empty one is neither.
// Since everything is in the body, the Standard Webhooks signature of the
// body covers every attribute. The event's own headers are also sent as
// HTTP headers of their name (those HTTP can carry), for HTTP middleware
// such as tracing; they are unsigned copies, which Decode ignores.
//
// Binary mode: the body is the payload byte for byte, Content-Type is the
// event's content type, and the attributes are ce- headers: ce-specversion,
// ce-id, ce-type, ce-source, ce-subject, ce-time, ce-aggregatetype,
// ce-sequence, ce-schemaversion, ce-partitionkey, ce-skippedfrom and
// ce-replayid as above. String values are percent-encoded as the binding
// specifies (space, '"', '%' and non-ASCII bytes as %XX). The event's own
// headers are sent as HTTP headers of their name; since HTTP header names
// are case-insensitive, ce-outboxheaders lists their names as the event
// spelled them, which lets [Decode] restore Message.Headers exactly. A
// header value HTTP cannot carry unchanged (control characters, leading or
// trailing space; the writer refuses those) fails its message as
// outbox.Permanent. The headers are signed by webhook-outbox-signature
// (below).
//
// # Signatures
//
// Requests are signed as Standard Webhooks (https://www.standardwebhooks.com):
//
//	webhook-id:        the delivery id (below)
//	webhook-timestamp: Unix seconds of this attempt
//	webhook-signature: v1,<base64 HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>">
//	Idempotency-Key:   the delivery id
//
// In binary mode the attributes are not in the body, so a request also
// carries
//
//	webhook-outbox-signature: v1,<base64 HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<canonical headers>\n<body>">
//
// where the canonical headers are one line "name:value\n" per header value,
// for every header whose name starts with "ce-", for Content-Type, and for
// every header ce-outboxheaders names; names in lower case, sorted bytewise,
// each name's values in the order the request carries them, values exactly
// as carried (percent-encoding included). A receiver that checks only
// webhook-signature (a generic Standard Webhooks library) must not act on
// the ce- headers of a binary-mode request. docs/destinations.md has test
// vectors of both modes.
//
// The HMAC key is the base64-decoded part of a "whsec_" secret (at least
// MinSecretBytes bytes). Several secrets may be active at once: each adds a
// v1 signature, separated by spaces, so a secret rotates by adding the new
// one to the sender, then to the receiver, then removing the old one from
// both. A malformed secret is an error that names its position, never its
// text.
//
// The delivery id ([DeliveryID]) is the event id, or "<event id>:<replay
// id>" for an event sent again by outbox replay: a receiver that drops
// repeated webhook-ids or Idempotency-Keys drops the relay's retries of one
// delivery but lets a replay through, as Nats-Msg-Id does on NATS. It is
// signed, and it must be the delivery id of the event the request carries
// (Decode checks it), so a receiver may deduplicate by it. Consumers that
// must apply an event once deduplicate by the event id (which a replay
// keeps), as the inbox does.
//
// # Answers and errors
//
// Publish sends a batch's messages concurrently (Config.Concurrency at a
// time) and never retries: the relay does. The answer decides:
//
//	2xx                                          accepted (the event is published)
//	429                                          outbox.Unavailable with outbox.RetryAfter (its
//	                                               Retry-After, or a second): throttled, the event
//	                                               alone waits, no attempt spent
//	502, 503, 504                                outbox.Unavailable: the service behind the URL is
//	                                               down (no attempt spent)
//	401, 403, 404, 405, 410; 3xx (redirects are  outbox.Unavailable: the same for every event (a
//	  not followed)                                secret the receiver does not know, a wrong or
//	                                               moved URL), fixed by configuration
//	408, 425, other 5xx                          retryable error (attempt spent, backoff)
//	timeout or reset after the request was sent  retryable error
//	no connection: DNS, refused, TLS handshake,
//	  timeout while connecting                   outbox.Unavailable (no attempt spent)
//	other 4xx (400, 413, 415, 422, ...)          outbox.Permanent (quarantined): the endpoint
//	                                               refused this event
//
// An answer that does not depend on the event must not quarantine it: a
// wrong secret, path or redirect would otherwise quarantine every event in
// turn. The relay treats such answers as the endpoint being unavailable
// when a batch gets nothing else (it waits and probes, releasing the events
// untouched), and, when it gets them for one event while others are
// accepted, claim after claim (LoneOutageLimit), as that event's failure;
// except when the answer came with a Retry-After (a throttled request),
// which only ever delays its event.
//
// Errors for an answer are a [StatusError] quoting the start of the
// response body (at most Config.MaxResponseBytes is read, 1 KiB quoted).
// A Retry-After header (seconds or an HTTP date) on such an answer is kept
// in the error, read by [RetryAfter], and marked with outbox.RetryAfter: the
// relay waits at least that long (at most outbox.RetryAfterMax) before the
// event's next attempt, spending none of its attempts when the answer was
// unavailable (a throttled event waits alone; the relay is not in an outage
// while other events are accepted).
// [Publisher.Probe] sends one HEAD request; any HTTP answer means reachable.
//
// # Guarantees
//
// Delivery is at least once: a 2xx lost on the way back, or a relay that
// crashes after the 2xx and before marking the event published, makes the
// relay POST the event again, with the same event id. Per aggregate, the
// relay sends event k+1 only after event k was answered 2xx, so an endpoint
// receives each aggregate's events in sequence order, one at a time (events
// of different aggregates arrive concurrently). There is no pipelining: an
// HTTP endpoint cannot refuse a request that overtook an earlier one, so
// sending k+1 before k's answer could apply them out of order.
//
// # Receiving
//
// [NewReceiver] returns an http.Handler that accepts one content mode
// (ReceiverOptions.Mode, structured by default, as the relay's outbox_mode)
// and refuses the other with 401: the signature of the body does not cover
// the Content-Type that says the mode, so the mode is the receiver's
// configuration, never the request's (a captured binary-mode request re-sent
// as structured mode would otherwise have its payload read as the event's
// attributes; for the same reason, binary mode refuses an event whose own
// content type is application/cloudevents+json, and endpoints of different
// modes should not share a secret). It checks the signatures against
// any of its secrets (in constant time) and the timestamp against a
// tolerance (5 minutes either way), caps the body, decodes the message,
// checks that the signed webhook-id is the event's delivery id, and calls a
// function with it: 2xx when the function returned nil, 500 (the relay
// retries) when it failed, 422 (the relay quarantines the event) when its
// error is marked outbox.Permanent (a Retry-After header on the 500 when it
// is marked outbox.RetryAfter), 401 for a bad signature, timestamp or
// webhook-id, or attributes that are not signed, 400 for a request that is
// not an outbox event. It remembers the deliveries it handled while their
// timestamps are within the tolerance: a copy of a request it answered 2xx,
// whether the relay's retry after a lost answer or a replay of a captured
// request, is answered 204 again without calling the function, and a copy
// that arrives while the first is being handled waits for its outcome. The
// timestamp check and the memory read the clock once per request, from a
// clock that never goes back, so nothing is forgotten while a copy of it
// would still be accepted. The memory is bounded (ReceiverOptions.Remember
// deliveries, 65,536 by default, about 200 bytes each); when full it
// forgets the delivery with the oldest timestamp and then refuses (503,
// Retry-After: 1) any delivery it does not remember that is no newer, which
// the relay sends again with a new timestamp. That memory is per process: after a
// restart, or on another instance behind the same URL, a copy reaches the
// function again. To apply each event once, in order, call the inbox
// (package inbox) from the function, which deduplicates by event id in the
// database, and return an error for an Early outcome, so the relay retries
// it after the missing event: outbox.RetryAfter(err, inbox.RedeliveryDelay(1))
// sets the answer's Retry-After (a request carries no delivery count; the
// relay's own backoff lengthens the pauses of an event that keeps failing).
// See the examples.
package outboxwebhook
