package destination

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/rabbittest"
)

// TestOpenAMQP: an amqp:// destination opens a publisher on the real
// broker; an unreachable one is unavailable (so OpenWait waits for it); and
// no error repeats the URL's password.
func TestOpenAMQP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, closeFn, err := Open(ctx, Options{URL: rabbittest.URL() + "?exchange=" + rabbittest.UniqueName("outboxtest-x"), Source: "/t"})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	closeFn()
	if _, ok := p.(outbox.Prober); !ok {
		t.Fatal("the AMQP publisher is not a Prober")
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := l.Addr().String()
	l.Close()
	const pw = "s3cret-pw"
	tries := 0
	_, _, err = OpenWait(ctx, Options{URL: "amqp://guest:" + pw + "@" + free + "/?dial_timeout=1s"}, func(ctx context.Context, err error) error {
		tries++
		if tries < 2 {
			return nil
		}
		return err
	})
	if !outbox.IsUnavailable(err) || tries != 2 {
		t.Fatalf("OpenWait on a free port: %v after %d retries, want unavailable after 2", err, tries)
	}
	for _, raw := range []string{
		"amqp://guest:" + pw + "@" + free + "/",
		"amqp://guest:" + pw + "@127.0.0.1:5672/?exchange=" + rabbittest.UniqueName("outboxtest-x"),
		"amqp://guest:" + pw + "@127.0.0.1:x/",
		"amqp://guest:" + pw + "@127.0.0.1:5672/?bad=1",
		"amqp://guest:" + pw + "@127.0.0.1:5672/%zz",
	} {
		_, _, err := Open(ctx, Options{URL: raw})
		if err == nil {
			t.Errorf("Open(%s) succeeded", raw)
		} else if strings.Contains(err.Error(), pw) {
			t.Errorf("Open: %v repeats the password", err)
		}
	}
}
