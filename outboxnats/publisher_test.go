package outboxnats_test

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/outboxnats"
)

func TestNewPublisherCreatesStream(t *testing.T) {
	t.Parallel()
	servers(t, func(t *testing.T, js jetstream.JetStream) {
		cfg := natstest.Config(t)
		cfg.DuplicateWindow = 90 * time.Second
		p := natstest.Publisher(t, js, cfg)
		if p.Stream() != cfg.Stream {
			t.Errorf("Stream() = %q, want %q", p.Stream(), cfg.Stream)
		}
		info := streamInfo(t, js, cfg.Stream)
		if want := []string{cfg.SubjectPrefix + ".>"}; !slices.Equal(info.Config.Subjects, want) {
			t.Errorf("subjects = %q, want %q", info.Config.Subjects, want)
		}
		if info.Config.Storage != jetstream.FileStorage {
			t.Errorf("storage = %v, want file", info.Config.Storage)
		}
		if info.Config.Duplicates != 90*time.Second {
			t.Errorf("duplicate window = %v, want 90s", info.Config.Duplicates)
		}

		// A second publisher on the same stream accepts what the first made.
		again, err := outboxnats.NewPublisher(testCtx(t), js, cfg)
		if err != nil {
			t.Fatalf("NewPublisher on the existing stream: %v", err)
		}
		checkNil(t, again.Publish(testCtx(t), []outbox.Message{event("o-1", 1)}))
	})
}

func TestNewPublisherDefaults(t *testing.T) {
	t.Parallel()
	js := natstest.JetStream(t, natstest.Connect(t, natstest.Embedded(t).ClientURL()))
	p, err := outboxnats.NewPublisher(testCtx(t), js, outboxnats.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Stream() != outboxnats.StreamDefault || p.SubjectPrefix() != outboxnats.SubjectPrefixDefault {
		t.Errorf("stream %q prefix %q, want the defaults", p.Stream(), p.SubjectPrefix())
	}
	info := streamInfo(t, js, outboxnats.StreamDefault)
	if info.Config.Duplicates != outboxnats.DuplicateWindowDefault || !slices.Equal(info.Config.Subjects, []string{"outbox.>"}) {
		t.Errorf("stream config %+v", info.Config)
	}
	msg := event("o-1", 1)
	checkNil(t, p.Publish(testCtx(t), []outbox.Message{msg}))
	s, _ := js.Stream(testCtx(t), outboxnats.StreamDefault)
	raw, err := s.GetMsg(testCtx(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := raw.Header.Get("ce-source"); got != outboxnats.SourceDefault {
		t.Errorf("ce-source = %q, want %q", got, outboxnats.SourceDefault)
	}
}

func TestNewPublisherAcceptsCompatibleStream(t *testing.T) {
	t.Parallel()
	servers(t, func(t *testing.T, js jetstream.JetStream) {
		ctx := testCtx(t)
		base := natstest.Config(t)
		for _, c := range []struct {
			name     string
			subjects []string
			prefix   string
		}{
			{"exact", []string{base.SubjectPrefix + ".>"}, base.SubjectPrefix},
			{"wider wildcard", []string{"other_" + base.SubjectPrefix, base.SubjectPrefix + ".*.>"}, base.SubjectPrefix + ".outbox"},
			{"parent", []string{base.SubjectPrefix + ".>"}, base.SubjectPrefix + ".a.b"},
		} {
			t.Run(c.name, func(t *testing.T) {
				cfg := natstest.Config(t)
				cfg.SubjectPrefix = c.prefix
				natstest.DeleteStreamAtCleanup(t, js, cfg.Stream)
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: c.subjects, Storage: jetstream.MemoryStorage}); err != nil {
					t.Fatal(err)
				}
				p, err := outboxnats.NewPublisher(ctx, js, cfg)
				if err != nil {
					t.Fatalf("NewPublisher refused a stream on %q for prefix %q: %v", c.subjects, c.prefix, err)
				}
				checkNil(t, p.Publish(ctx, []outbox.Message{event("o-1", 1)}))
				if info := streamInfo(t, js, cfg.Stream); info.Config.Storage != jetstream.MemoryStorage || info.State.Msgs != 1 {
					t.Errorf("existing stream changed or not written: %+v, %+v", info.Config, info.State)
				}
			})
		}
	})
}

func TestNewPublisherRefusesIncompatibleStream(t *testing.T) {
	t.Parallel()
	servers(t, func(t *testing.T, js jetstream.JetStream) {
		ctx := testCtx(t)
		base := natstest.Config(t)
		for _, c := range []struct {
			name     string
			cfg      jetstream.StreamConfig
			prefix   string
			contains string
		}{
			{"other subjects", jetstream.StreamConfig{Subjects: []string{base.SubjectPrefix + ".other.>"}}, base.SubjectPrefix, "do not cover"},
			{"narrower", jetstream.StreamConfig{Subjects: []string{base.SubjectPrefix + ".*"}}, base.SubjectPrefix, "do not cover"},
			{"prefix only", jetstream.StreamConfig{Subjects: []string{base.SubjectPrefix}}, base.SubjectPrefix, "do not cover"},
			{"no ack", jetstream.StreamConfig{Subjects: []string{base.SubjectPrefix + ".>"}, NoAck: true}, base.SubjectPrefix, "no_ack"},
		} {
			t.Run(c.name, func(t *testing.T) {
				cfg := natstest.Config(t)
				cfg.SubjectPrefix = c.prefix
				c.cfg.Name = cfg.Stream
				c.cfg.Storage = jetstream.MemoryStorage
				natstest.DeleteStreamAtCleanup(t, js, cfg.Stream)
				if _, err := js.CreateStream(ctx, c.cfg); err != nil {
					t.Fatal(err)
				}
				_, err := outboxnats.NewPublisher(ctx, js, cfg)
				if err == nil || !strings.Contains(err.Error(), c.contains) || !strings.Contains(err.Error(), cfg.Stream) {
					t.Fatalf("NewPublisher on a stream with %q: err = %v, want one naming the stream and saying %q", c.cfg.Subjects, err, c.contains)
				}
			})
		}
	})
}

func TestNewPublisherInvalidConfig(t *testing.T) {
	t.Parallel()
	js := natstest.JetStream(t, natstest.Conn(t))
	for _, cfg := range []outboxnats.Config{
		{Stream: "s", SubjectPrefix: "a.*"},
		{Stream: "s", SubjectPrefix: "a..b"},
		{Stream: "s", SubjectPrefix: "a b"},
		{Stream: "s", SubjectPrefix: ">"},
		{Stream: "a.b", SubjectPrefix: "p"},
	} {
		if _, err := outboxnats.NewPublisher(testCtx(t), js, cfg); err == nil {
			t.Errorf("NewPublisher(%+v) succeeded", cfg)
		}
	}
}

// TestHeaders reads a published message back and checks every header.
func TestHeaders(t *testing.T) {
	t.Parallel()
	servers(t, func(t *testing.T, js jetstream.JetStream) {
		ctx := testCtx(t)
		cfg := natstest.Config(t)
		cfg.Source = "/orders-api"
		p := natstest.Publisher(t, js, cfg)
		msg := event("o-42", 7)
		msg.SchemaVersion = 3
		msg.Headers = map[string]string{
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"tracestate":  "congo=t61rcWkgMzE",
			// Must not override the adapter's headers.
			"ce-id":        "forged",
			"CE-Type":      "forged",
			"Content-Type": "text/plain",
			"Nats-Msg-Id":  "forged",
		}
		checkNil(t, p.Publish(ctx, []outbox.Message{msg}))

		s, err := js.Stream(ctx, cfg.Stream)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := s.GetMsg(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if want := outboxnats.Subject(cfg.SubjectPrefix, "order", "o-42"); raw.Subject != want {
			t.Errorf("subject = %q, want %q", raw.Subject, want)
		}
		if !bytes.Equal(raw.Data, msg.Payload) {
			t.Errorf("data = %q, want %q", raw.Data, msg.Payload)
		}
		want := nats.Header{
			"ce-specversion":   {"1.0"},
			"ce-id":            {msg.ID.String()},
			"ce-type":          {"OrderCreated"},
			"ce-source":        {"/orders-api"},
			"ce-subject":       {"o-42"},
			"ce-time":          {"2026-03-14T15:09:26.542897Z"},
			"ce-aggregatetype": {"order"},
			"ce-sequence":      {"00000000000000000007"},
			"ce-schemaversion": {"3"},
			"ce-partitionkey":  {"o-42"},
			"content-type":     {"application/json"},
			"Nats-Msg-Id":      {msg.ID.String()},
			"traceparent":      {msg.Headers["traceparent"]},
			"tracestate":       {msg.Headers["tracestate"]},
		}
		if !maps.EqualFunc(map[string][]string(raw.Header), map[string][]string(want), slices.Equal) {
			t.Errorf("headers:\n got %v\nwant %v", raw.Header, want)
		}
	})
}

func TestDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	servers(t, func(t *testing.T, js jetstream.JetStream) {
		ctx := testCtx(t)
		p := natstest.Publisher(t, js, outboxnats.Config{})
		var msgs []outbox.Message
		for i, id := range []string{"o-1", "a.b", " padded ", "line\r\nbreak", `50% "off"`, "日本語 🙂", "", "*", ">"} {
			m := event(id, int64(i+1))
			m.AggregateType = "order " + id // weird types too
			m.Type = "Order Created"
			m.SchemaVersion = i + 1
			if i%2 == 0 {
				m.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
			}
			msgs = append(msgs, m)
		}
		checkNil(t, p.Publish(ctx, msgs))
		got := readAll(t, js, p.Stream(), len(msgs))
		for i, delivered := range got {
			dec, err := outboxnats.Decode(delivered.Headers(), delivered.Data())
			if err != nil {
				t.Fatalf("Decode message %d: %v", i, err)
			}
			want := msgs[i]
			want.Attempt = 0
			if !equalMessage(dec, want) {
				t.Errorf("message %d:\n got %+v\nwant %+v", i, dec, want)
			}
			wantSubject := outboxnats.Subject(p.SubjectPrefix(), want.AggregateType, want.AggregateID)
			if delivered.Subject() != wantSubject {
				t.Errorf("message %d subject %q, want %q", i, delivered.Subject(), wantSubject)
			}
		}
	})
}

func equalMessage(a, b outbox.Message) bool {
	return a.ID == b.ID && a.AggregateType == b.AggregateType && a.AggregateID == b.AggregateID &&
		a.Sequence == b.Sequence && a.Type == b.Type && a.SchemaVersion == b.SchemaVersion && a.ContentType == b.ContentType &&
		bytes.Equal(a.Payload, b.Payload) && maps.Equal(a.Headers, b.Headers) &&
		a.OccurredAt.Equal(b.OccurredAt) && a.OccurredAt.Location() == time.UTC && a.Attempt == b.Attempt
}

func TestDecodeRejects(t *testing.T) {
	t.Parallel()
	full := func() nats.Header {
		return nats.Header{
			"ce-specversion":   {"1.0"},
			"ce-id":            {"6f1c2f9e-8a58-4b8e-9c07-5f4c8f7f2a11"},
			"ce-type":          {"OrderCreated"},
			"ce-source":        {"/outbox"},
			"ce-subject":       {"o-1"},
			"ce-time":          {"2026-03-14T15:09:26Z"},
			"ce-aggregatetype": {"order"},
			"ce-sequence":      {"00000000000000000001"},
			"ce-schemaversion": {"1"},
			"ce-partitionkey":  {"o-1"},
			"content-type":     {"application/json"},
		}
	}
	m, err := outboxnats.Decode(full(), []byte(`{}`))
	if err != nil || m.Sequence != 1 || m.AggregateID != "o-1" || m.Headers != nil {
		t.Fatalf("Decode(full) = %+v, %v", m, err)
	}
	// Header names are case-insensitive.
	upper := nats.Header{}
	for k, v := range full() {
		upper[strings.ToUpper(k)] = v
	}
	if _, err := outboxnats.Decode(upper, nil); err != nil {
		t.Errorf("Decode(upper-case names): %v", err)
	}
	for _, key := range []string{"ce-specversion", "ce-id", "ce-type", "ce-subject", "ce-time", "ce-aggregatetype", "ce-sequence", "ce-schemaversion"} {
		h := full()
		delete(h, key)
		if _, err := outboxnats.Decode(h, nil); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("Decode without %s: err = %v", key, err)
		}
	}
	for key, bad := range map[string]string{
		"ce-specversion": "0.3", "ce-id": "nope", "ce-time": "yesterday", "ce-sequence": "x",
		"ce-schemaversion": "v1", "ce-subject": "bad%zz",
	} {
		h := full()
		if _, ok := h[key]; !ok {
			continue
		}
		h[key] = []string{bad}
		if _, err := outboxnats.Decode(h, nil); err == nil {
			t.Errorf("Decode with %s: %q succeeded", key, bad)
		}
	}
	if _, err := outboxnats.Decode(nil, []byte("plain")); err == nil {
		t.Error("Decode(no headers) succeeded")
	}
}

// TestPublishManyInOrder publishes 5,000 messages in one call: 50
// aggregates with 100 events each, interleaved.
func TestPublishManyInOrder(t *testing.T) {
	t.Parallel()
	servers(t, func(t *testing.T, js jetstream.JetStream) {
		ctx := testCtx(t)
		p := natstest.Publisher(t, js, outboxnats.Config{})
		const aggregates, perAggregate = 50, 100
		var msgs []outbox.Message
		for seq := int64(1); seq <= perAggregate; seq++ {
			for a := range aggregates {
				msgs = append(msgs, event("o."+string(rune('A'+a)), seq))
			}
		}
		checkNil(t, p.Publish(ctx, msgs))
		if info := streamInfo(t, js, p.Stream()); info.State.Msgs != uint64(len(msgs)) {
			t.Fatalf("stream has %d messages, want %d", info.State.Msgs, len(msgs))
		}
		last := map[string]int64{}
		for _, m := range readAll(t, js, p.Stream(), len(msgs)) {
			dec, err := outboxnats.Decode(m.Headers(), m.Data())
			if err != nil {
				t.Fatal(err)
			}
			if dec.Sequence != last[m.Subject()]+1 {
				t.Fatalf("subject %s: sequence %d after %d", m.Subject(), dec.Sequence, last[m.Subject()])
			}
			last[m.Subject()] = dec.Sequence
		}
		if len(last) != aggregates {
			t.Fatalf("%d subjects, want %d", len(last), aggregates)
		}
	})
}

func TestPublishSmallMaxPending(t *testing.T) {
	t.Parallel()
	js := natstest.JetStream(t, natstest.Connect(t, natstest.Embedded(t).ClientURL()))
	p := natstest.Publisher(t, js, outboxnats.Config{MaxPending: 3})
	var msgs []outbox.Message
	for i := range 500 {
		msgs = append(msgs, event("o-1", int64(i+1)))
	}
	checkNil(t, p.Publish(testCtx(t), msgs))
	if n := streamInfo(t, js, p.Stream()).State.Msgs; n != 500 {
		t.Fatalf("stream has %d messages, want 500", n)
	}
}

func TestPublishConcurrent(t *testing.T) {
	t.Parallel()
	servers(t, func(t *testing.T, js jetstream.JetStream) {
		p := natstest.Publisher(t, js, outboxnats.Config{MaxPending: 16})
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				var msgs []outbox.Message
				for i := range 100 {
					msgs = append(msgs, event(string(rune('a'+g)), int64(i+1)))
				}
				checkNil(t, p.Publish(testCtx(t), msgs))
			})
		}
		wg.Wait()
		if n := streamInfo(t, js, p.Stream()).State.Msgs; n != 800 {
			t.Fatalf("stream has %d messages, want 800", n)
		}
	})
}

func TestPublishDuplicateIsSuccess(t *testing.T) {
	t.Parallel()
	servers(t, func(t *testing.T, js jetstream.JetStream) {
		ctx := testCtx(t)
		p := natstest.Publisher(t, js, outboxnats.Config{})
		msg := event("o-1", 1)
		checkNil(t, p.Publish(ctx, []outbox.Message{msg}))
		// The relay republishes after a crash between ack and mark.
		again := msg
		again.Attempt = 2
		checkNil(t, p.Publish(ctx, []outbox.Message{again}))
		// Even twice in one call.
		checkNil(t, p.Publish(ctx, []outbox.Message{msg, again}))
		if n := streamInfo(t, js, p.Stream()).State.Msgs; n != 1 {
			t.Fatalf("stream has %d messages, want 1", n)
		}
	})
}

func TestPublishEmpty(t *testing.T) {
	t.Parallel()
	js := natstest.JetStream(t, natstest.Conn(t))
	p := natstest.Publisher(t, js, outboxnats.Config{})
	if errs := p.Publish(testCtx(t), nil); errs != nil {
		t.Fatalf("Publish(nil) = %v", errs)
	}
}

func TestPublishTooLargeIsPermanent(t *testing.T) {
	t.Parallel()
	servers(t, func(t *testing.T, js jetstream.JetStream) {
		ctx := testCtx(t)
		p := natstest.Publisher(t, js, outboxnats.Config{})
		big := event("o-2", 1)
		big.Payload = bytes.Repeat([]byte("x"), int(js.Conn().MaxPayload())+1)
		// Just below the limit with the headers is too large too.
		edge := event("o-4", 1)
		edge.Payload = bytes.Repeat([]byte("x"), int(js.Conn().MaxPayload())-10)
		msgs := []outbox.Message{event("o-1", 1), big, event("o-3", 1), edge}
		errs := p.Publish(ctx, msgs)
		if len(errs) != len(msgs) {
			t.Fatalf("Publish returned %d errors for %d messages", len(errs), len(msgs))
		}
		if errs[0] != nil || errs[2] != nil {
			t.Fatalf("small messages failed: %v, %v", errs[0], errs[2])
		}
		for _, err := range []error{errs[1], errs[3]} {
			if !outbox.IsPermanent(err) || !errors.Is(err, nats.ErrMaxPayload) {
				t.Errorf("too large: err = %v, want permanent ErrMaxPayload", err)
			}
		}
		if n := streamInfo(t, js, p.Stream()).State.Msgs; n != 2 {
			t.Fatalf("stream has %d messages, want 2", n)
		}
	})
}

// TestPublishOverStreamMaxMsgSizeIsPermanent covers the refusal by the
// stream (not the client's max payload check).
func TestPublishOverStreamMaxMsgSizeIsPermanent(t *testing.T) {
	t.Parallel()
	servers(t, func(t *testing.T, js jetstream.JetStream) {
		ctx := testCtx(t)
		cfg := natstest.Config(t)
		natstest.DeleteStreamAtCleanup(t, js, cfg.Stream)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
			Name: cfg.Stream, Subjects: []string{cfg.SubjectPrefix + ".>"}, Storage: jetstream.MemoryStorage, MaxMsgSize: 2048,
		}); err != nil {
			t.Fatal(err)
		}
		p, err := outboxnats.NewPublisher(ctx, js, cfg)
		if err != nil {
			t.Fatal(err)
		}
		big := event("o-1", 1)
		big.Payload = bytes.Repeat([]byte("x"), 4096)
		errs := p.Publish(ctx, []outbox.Message{big, event("o-2", 1)})
		if len(errs) != 2 || !outbox.IsPermanent(errs[0]) || errs[1] != nil {
			t.Fatalf("errs = %v, want [permanent, nil]", errs)
		}
	})
}

func TestPublishInvalidHeaderIsPermanent(t *testing.T) {
	t.Parallel()
	js := natstest.JetStream(t, natstest.Conn(t))
	p := natstest.Publisher(t, js, outboxnats.Config{})
	bad := event("o-1", 1)
	bad.Headers = map[string]string{"bad key": "v"}
	errs := p.Publish(testCtx(t), []outbox.Message{bad})
	if len(errs) != 1 || !outbox.IsPermanent(errs[0]) {
		t.Fatalf("errs = %v, want one permanent error", errs)
	}
}

// TestBrokerDown stops the embedded server: every publish fails as
// unavailable; a server restarted on the same port and store brings the
// stream back and publishing works again on the same publisher.
func TestBrokerDown(t *testing.T) {
	t.Parallel()
	e := natstest.Embedded(t)
	nc := natstest.Connect(t, e.ClientURL())
	js := natstest.JetStream(t, nc)
	p := natstest.Publisher(t, js, outboxnats.Config{})
	ctx := testCtx(t)
	checkNil(t, p.Publish(ctx, []outbox.Message{event("o-1", 1)}))

	status := nc.StatusChanged(nats.RECONNECTING, nats.CONNECTED)
	defer nc.RemoveStatusListener(status)
	e.Shutdown()
	waitStatus(t, status, nats.RECONNECTING)

	var msgs []outbox.Message
	for i := range 20 {
		msgs = append(msgs, event("o-2", int64(i+1)))
	}
	errs := p.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("broker down: Publish returned %d errors for %d messages", len(errs), len(msgs))
	}
	for i, err := range errs {
		if !outbox.IsUnavailable(err) {
			t.Fatalf("broker down: message %d: err = %v, want unavailable", i, err)
		}
	}
	t.Logf("broker down: %v", errs[0])

	e2, err := outboxnats.StartEmbedded(e.StoreDir(), e.Port())
	if err != nil {
		t.Fatalf("restart embedded server: %v", err)
	}
	t.Cleanup(e2.Shutdown)
	waitStatus(t, status, nats.CONNECTED)

	checkNil(t, p.Publish(ctx, msgs))
	if n := streamInfo(t, js, p.Stream()).State.Msgs; n != 21 {
		t.Fatalf("stream has %d messages after restart, want 21", n)
	}
	// Clean up now: e2 stops before the cleanups registered earlier run.
	if err := js.DeleteStream(ctx, p.Stream()); err != nil {
		t.Fatal(err)
	}
	nc.Close()
}

// TestBrokerGoesDownWhileWaiting stops the server while acks are awaited.
func TestBrokerGoesDownWhileWaiting(t *testing.T) {
	t.Parallel()
	e := natstest.Embedded(t)
	nc := natstest.Connect(t, e.ClientURL())
	js := natstest.JetStream(t, nc)
	p := natstest.Publisher(t, js, outboxnats.Config{})
	ctx := testCtx(t)
	// A plain subscriber receives the messages (and never acknowledges
	// them) in place of the deleted stream, so the acks are pending when the
	// server goes away.
	sub := natstest.Connect(t, e.ClientURL())
	received := make(chan struct{}, 1)
	if _, err := sub.Subscribe(p.SubjectPrefix()+".>", func(*nats.Msg) {
		select {
		case received <- struct{}{}:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, p.Stream()); err != nil {
		t.Fatal(err)
	}
	go func() {
		<-received
		e.Shutdown()
	}()
	errs := p.Publish(ctx, []outbox.Message{event("o-1", 1), event("o-2", 1)})
	if len(errs) != 2 {
		t.Fatalf("errs = %v", errs)
	}
	for i, err := range errs {
		if !outbox.IsUnavailable(err) {
			t.Fatalf("message %d: err = %v, want unavailable", i, err)
		}
		t.Logf("message %d: %v", i, err)
	}
}

// TestStreamGoneIsUnavailable deletes the stream under the publisher: no
// one answers the subject any more.
func TestStreamGoneIsUnavailable(t *testing.T) {
	t.Parallel()
	servers(t, func(t *testing.T, js jetstream.JetStream) {
		ctx := testCtx(t)
		p := natstest.Publisher(t, js, outboxnats.Config{})
		if err := js.DeleteStream(ctx, p.Stream()); err != nil {
			t.Fatal(err)
		}
		errs := p.Publish(ctx, []outbox.Message{event("o-1", 1), event("o-2", 1)})
		if len(errs) != 2 || !outbox.IsUnavailable(errs[0]) || !outbox.IsUnavailable(errs[1]) {
			t.Fatalf("errs = %v, want two unavailable errors", errs)
		}
	})
}

// silentSubject makes acks never come: the stream is replaced by a plain
// subscriber that receives the messages and never replies. received gets a
// value per message.
func silentSubject(t *testing.T, js jetstream.JetStream, p *outboxnats.Publisher) <-chan struct{} {
	t.Helper()
	received := make(chan struct{}, 100)
	if err := js.DeleteStream(testCtx(t), p.Stream()); err != nil {
		t.Fatal(err)
	}
	sub, err := js.Conn().Subscribe(p.SubjectPrefix()+".>", func(*nats.Msg) { received <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := js.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	return received
}

func TestPublishContextCanceled(t *testing.T) {
	t.Parallel()
	servers(t, func(t *testing.T, js jetstream.JetStream) {
		p := natstest.Publisher(t, js, outboxnats.Config{AckTimeout: time.Minute})

		// Canceled before the call: nothing is sent.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		errs := p.Publish(ctx, []outbox.Message{event("o-1", 1), event("o-2", 1)})
		if len(errs) != 2 || !errors.Is(errs[0], context.Canceled) || !errors.Is(errs[1], context.Canceled) {
			t.Fatalf("errs = %v, want context.Canceled twice", errs)
		}

		// Canceled while waiting for acks that never come.
		received := silentSubject(t, js, p)
		ctx, cancel = context.WithCancel(context.Background())
		go func() {
			<-received
			cancel()
		}()
		errs = p.Publish(ctx, []outbox.Message{event("o-1", 1), event("o-2", 1)})
		if len(errs) != 2 {
			t.Fatalf("errs = %v", errs)
		}
		for _, err := range errs {
			if !errors.Is(err, context.Canceled) || outbox.IsUnavailable(err) || outbox.IsPermanent(err) {
				t.Fatalf("err = %v, want a plain context.Canceled", err)
			}
		}

		// A deadline is a timeout waiting for the broker.
		ctx, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel2()
		errs = p.Publish(ctx, []outbox.Message{event("o-3", 1)})
		if len(errs) != 1 || !outbox.IsUnavailable(errs[0]) || !errors.Is(errs[0], context.DeadlineExceeded) {
			t.Fatalf("errs = %v, want unavailable deadline exceeded", errs)
		}
	})
}

func TestAckTimeoutIsUnavailable(t *testing.T) {
	t.Parallel()
	servers(t, func(t *testing.T, js jetstream.JetStream) {
		p := natstest.Publisher(t, js, outboxnats.Config{AckTimeout: 100 * time.Millisecond, MaxPending: 1})
		silentSubject(t, js, p)
		// More messages than MaxPending: each slot comes back on its timeout.
		errs := p.Publish(testCtx(t), []outbox.Message{event("o-1", 1), event("o-2", 1), event("o-3", 1)})
		if len(errs) != 3 {
			t.Fatalf("errs = %v", errs)
		}
		for _, err := range errs {
			if !outbox.IsUnavailable(err) || !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
				t.Fatalf("err = %v, want unavailable ack timeout", err)
			}
		}
	})
}

func TestConnectionClosedIsUnavailable(t *testing.T) {
	t.Parallel()
	servers(t, func(t *testing.T, js jetstream.JetStream) {
		own := natstest.Publisher(t, js, outboxnats.Config{})
		// A second connection, closed under its publisher (the first one
		// deletes the stream at cleanup).
		nc := natstest.Connect(t, js.Conn().ConnectedUrl())
		p, err := outboxnats.NewPublisher(testCtx(t), natstest.JetStream(t, nc), outboxnats.Config{Stream: own.Stream(), SubjectPrefix: own.SubjectPrefix()})
		if err != nil {
			t.Fatal(err)
		}
		nc.Close()
		errs := p.Publish(testCtx(t), []outbox.Message{event("o-1", 1)})
		if len(errs) != 1 || !outbox.IsUnavailable(errs[0]) || !errors.Is(errs[0], nats.ErrConnectionClosed) {
			t.Fatalf("errs = %v, want unavailable connection closed", errs)
		}
	})
}
