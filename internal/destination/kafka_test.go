package destination

import (
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxkafka"
)

// TestOpenKafkaSASL: a kafka:// destination naming a user authenticates
// with the password in OUTBOX_KAFKA_PASSWORD; a wrong one is unavailable
// (OpenWait waits for it), as a broker refusing it makes it; no error shows
// the password; and the flag's help names the variable.
func TestOpenKafkaSASL(t *testing.T) {
	const pw, wrong = "Kpw-5d1c0e", "Kwrong-77ab3"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(),
		kfake.Superuser(outboxkafka.SASLScramSHA256, "relay", pw))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	raw := "kafka://relay@" + strings.Join(c.ListenAddrs(), ",") + "?sasl=scram-sha-256"

	t.Setenv(outboxkafka.PasswordEnv, pw)
	p, closeFn, err := Open(ctx, Options{URL: raw, Source: "/t"})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	closeFn()
	if _, ok := p.(*outboxkafka.Publisher); !ok {
		t.Fatalf("Open returned %T", p)
	}

	// A broker answers a failed authentication with SASL_AUTHENTICATION_FAILED.
	c.ControlKey(int16(kmsg.SASLAuthenticate), func(r kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		resp := r.(*kmsg.SASLAuthenticateRequest).ResponseKind().(*kmsg.SASLAuthenticateResponse)
		resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
		return resp, nil, true
	})
	t.Setenv(outboxkafka.PasswordEnv, wrong)
	tries := 0
	_, _, err = OpenWait(ctx, Options{URL: raw}, func(ctx context.Context, err error) error {
		tries++
		if tries < 2 {
			return nil
		}
		return err
	})
	if !outbox.IsUnavailable(err) || !errors.Is(err, kerr.SaslAuthenticationFailed) || tries != 2 {
		t.Fatalf("OpenWait with a wrong password: %v after %d retries, want unavailable after 2", err, tries)
	}
	for _, e := range []error{err, func() error {
		_, _, err := Open(ctx, Options{URL: "kafka://relay:" + pw + "@h:9092?sasl=plain&bogus=1"})
		return err
	}()} {
		if e == nil || strings.Contains(e.Error(), pw) || strings.Contains(e.Error(), wrong) {
			t.Errorf("error %v: nil or shows the password", e)
		}
	}

	var o Options
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	o.Register(fs)
	if usage := fs.Lookup("destination").Usage; !strings.Contains(usage, outboxkafka.PasswordEnv) {
		t.Errorf("--destination help does not name %s: %s", outboxkafka.PasswordEnv, usage)
	}
}
