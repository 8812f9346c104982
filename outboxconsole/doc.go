// Package outboxconsole is the operator console of the outbox: a small web
// application, served by `outbox console`, that shows what `outbox status`
// shows and lets an operator unstick the outbox without a terminal.
//
// New returns an http.Handler; mount it on a server of your own, or run the
// command. Pages are rendered on the server with html/template; the
// stylesheet, a small script that refreshes the page and everything else
// are embedded in the binary (no CDN: it works offline), and the chart is
// an inline SVG drawn on the server.
//
// # Many outboxes
//
// NewMulti returns the handler of one console for several outboxes (what
// `outbox console --config relay.yaml` serves for a fleet's file): an index
// at / of every source (MultiConfig.Sources, called at each load, so that
// a schema that appeared is listed) with its headline figures
// (Admin.Gauges: backlog, oldest pending age, quarantined, relays alive),
// a source that cannot be read marked down with its error, each within
// MultiConfig.FiguresTimeout so that one unreachable database does not
// hold up the others; and each source's pages, as New serves them, under
// /sources/<database>/<schema>/, every link, form, redirect and paging URL
// under that prefix (the static files and /login, /logout stay at the
// root). The gate described under Security (Host check, login, session
// and its revocation, throttle, proxy identity, CSRF, same-origin) is one
// for the whole console: an operator logs in once, and the same session
// and CSRF token serve every source. Each action is recorded in its
// source's own outbox_operations. Replay is not offered there.
//
// The sources of one pool are read at most its MaxConns at once, each
// source's FiguresTimeout starting at its turn, the whole index within
// MultiConfig.IndexTimeout ("not read in time" beyond it). Before any of a
// source's tables is read (on each load of the index, on each request to
// its pages), its schema and outbox tables must be owned by a role of
// Source.TrustedOwners (default: the pool's role), be tables, and carry no
// rule and no trigger of another role's function: PostgreSQL would run a
// tenant's view or trigger with the console's role. A source that fails is
// shown down, naming the object and its owner. New (one schema) does not
// check: its caller names the schema.
//
// # What it shows
//
// The overview page reads Admin.Status (the data of `outbox status`, one
// source of truth) and Admin.History: the backlog, the oldest pending
// event's age split in two (the oldest the relays could publish, and the
// oldest parked behind a quarantined event), charts of the last hour per
// minute (events published, failed publish attempts, the backlog at each
// minute's end, the median commit→ack latency), the relays with their
// heartbeats and health (ready or not, the /readyz reason, since when, the
// last error: what each relay records in its heartbeat row,
// outbox.RelayHealth) and the destinations (the relays alive grouped by the
// destination they recorded), leases in flight and expired, the events
// blocked behind quarantined ones, the inbox consumers with aggregates
// waiting on a gap (inbox.Admin), the side-effect attempts parked or of
// unknown outcome (sideeffect.Admin.Gauges, in a banner and a tile, so that
// they cannot go unseen), and the last operator actions. The quarantine,
// inbox, side-effect and operations pages list everything, one page at a
// time (keyset pagination: every query reads at most a page from an index),
// so the console stays usable with a million pending events. The
// side-effect page reads Config.SideEffectSchema's side_effects table; a
// schema without one is said so on the page and the overview. Its third
// tab lists the consumers' events waiting on an attempt
// (sideeffect.Caller.WaitTx; sideeffect.Admin.Waits, keyset on the waits'
// primary key), which resolving the attempt wakes: the event, its
// aggregate, the consumer, the attempt's name and key, since when, and
// Resume's runs and last error; the page's tiles and the overview's card
// count them (sideeffect.Admin.CountWaits, reading at most
// sideeffect.CountWaitsMax rows: "10,000+" past it).
//
// # Finding an event
//
// The Find page (/events) looks an event up by id (one lookup of the
// primary key), by aggregate (its lane: published through which sequence,
// its head, how many events are pending, parked and quarantined; then its
// events a page at a time by sequence) or by event type (Admin
// .FindEventsByType: among the unsettled events by aggregate, or the
// settled ones newest first; there is no index on the type, so each page
// walks an index for at most 10,000 events and says where it stopped). An
// event's page (/events/{id}) shows its state (pending, parked,
// quarantined, published, skipped), attempts, last error, when it is due,
// its lease, its headers and its payload, escaped (a binary one as a hex
// dump); /events/{id}/payload downloads the payload's exact bytes as an
// application/octet-stream attachment, sandboxed, never rendered.
//
// # Actions
//
// On the quarantine page an operator retries a quarantined event or skips
// it with a reason; on the inbox page resolves an aggregate's gap with a
// reason; on the side-effect page resolves a parked or unknown attempt as
// succeeded, as failed or "call again", with a reason; and on the overview
// replays one aggregate's events (when Config.Publisher is set). These call
// Admin.Retry, Admin.Skip, inbox.Admin.Resolve, sideeffect.Admin.Resolve
// and Admin.Replay, the audited operations the CLI runs: each lands in
// outbox_operations with who and why. The actor says how the console knew
// who acted: "console:token:<name>" (ActorTokenPrefix) for an operator who
// logged in with the token, the name being the one typed at login (a
// claim of whoever holds the shared token), and
// "console:proxy:<name>" (ActorProxyPrefix) for one a trusted proxy
// named (Config.AuthProxyHeader). Rows written by earlier versions say
// "console:<name>" for both; a login name never holds a colon, so the
// three forms are told apart. Both prefixes are stable: match them, e.g.
// actor LIKE 'console:proxy:%'.
//
// A bulk action retries or skips every quarantined event of an event type
// or whose last error contains a text: /quarantine/bulk first previews how
// many match and the first rows; the confirm form carries the set's bound
// (the last previewed event's quarantine time and id) and a digest of the
// set, signed for the session, and applies to at most BulkMax events,
// exactly those previewed: an event quarantined since is past the bound,
// and when the set changed (an event retried or skipped elsewhere) nothing
// is done and the new preview is shown. Each event goes through
// Admin.RetrySeen or Admin.SkipSeen, in lane order, with one audit row
// each; what the library refuses (a skip behind an unsettled event) is
// listed as refused, never forced.
//
// # Security
//
// The console answers only requests whose Host header it serves
// (Config.AllowedHosts; by default the loopback names and the host of
// Config.Origin), with 421 for any other, before anything else: a DNS
// rebinding page cannot read a console on 127.0.0.1 or behind "ssh -L".
//
// With Config.Token set, every page but the login page and the static
// files needs a login (a visitor without a session is sent to /login),
// unless Config.PublicRead; actions always need one. An operator logs in by
// posting the token and a name; the console answers with a session cookie
// (HttpOnly, SameSite=Strict, Secure over TLS) holding the name, an expiry,
// a random nonce and an HMAC-SHA256 keyed from the token and a random
// per-process secret (so restarting the console, or changing the token,
// ends every session). Logging out revokes the cookie on the server until
// it expires, so a copy of it is refused too. Failed logins are throttled
// per client address and overall (429 with Retry-After, before the token is
// checked). The token must be at least TokenMinLength bytes of at least
// TokenMinDistinctBytes different values (CheckToken); it is compared in
// constant time and never rendered or logged.
//
// Behind a reverse proxy that signs operators in, Config.AuthProxyHeader
// (e.g. "X-Forwarded-Email") replaces the token login: a request whose
// remote address (the TCP peer, never X-Forwarded-For or Forwarded) is in
// Config.TrustedProxies and that carries the header is that operator, and
// its actions are recorded as "console:proxy:<value>"; the forms' CSRF token is
// an HMAC of that name. The header from any other address is refused
// (403), and a value that is not a name (twice, a control or invisible
// character, not UTF-8, over ProxyNameMaxLength bytes) too (400). A
// request without it has no operator: no page (unless PublicRead), no
// action.
//
// Every POST is checked before routing and before any database work, and
// refused with 401 (no valid session, or a wrong token at login), 403
// (read-only, cross-origin, or a missing or wrong CSRF token) or 400 (a
// form value with a NUL or bytes that are not UTF-8). The CSRF token is an
// HMAC of the session, in a hidden field of every form; cross-origin
// requests are refused by http.CrossOriginProtection (Sec-Fetch-Site, or
// the Origin against the Host or Config.Origin), and a POST with neither
// header must carry a Referer of the console's origin. Responses carry a
// strict Content-Security-Policy (no inline script, no framing).
//
// Text from the database (ids, types, reasons, last errors) is shown with
// bidirectional overrides, zero-width and other invisible characters as
// [U+XXXX], and webhook URLs without their path (which can be a token);
// a filter with a NUL or bytes that are not UTF-8 is answered 400. The
// static directory is not listed.
//
// Without a token or a proxy, or with Config.ReadOnly, the console is
// read-only: the action forms are not rendered and every POST is refused
// (but logging in and out, when there is a token).
package outboxconsole
