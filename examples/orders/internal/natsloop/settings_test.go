package natsloop

import (
	"log/slog"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/outboxnats"
)

func TestWithDefaults(t *testing.T) {
	own := Settings{Durable: "d", InboxConsumer: "i", Workers: 3, AckWait: time.Minute, RetryDelay: time.Second}
	got := WithDefaults(Settings{}, own)
	want := own
	want.Schema, want.Stream, want.SubjectPrefix = "outbox", outboxnats.StreamDefault, outboxnats.SubjectPrefixDefault
	want.Logger = slog.Default()
	if got != want {
		t.Errorf("defaults: got %+v, want %+v", got, want)
	}
	set := Settings{Schema: "s", Stream: "st", SubjectPrefix: "p", Durable: "x", InboxConsumer: "y", Workers: 1,
		AckWait: time.Second, RetryDelay: time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
	if got := WithDefaults(set, own); got != set {
		t.Errorf("set fields: got %+v, want %+v", got, set)
	}
}
