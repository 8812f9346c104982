package main

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/examples/orders/provider"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

var providerListening = regexp.MustCompile(`provider listening.* addr=(\S+) control=(\S*)`)

// TestProviderCrash runs "orders provider" as its own process with a crash
// injected after the first charge's commit: the caller sees an ambiguous
// error and the process dies by SIGKILL; restarted on the same schema, the
// ledger still has the charge and a retry with the same key returns it
// instead of charging again. The restarted provider's faults are then set
// through its control listener, and it stops cleanly on SIGTERM even with a
// request hanging in an injected timeout.
func TestProviderCrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The provider's schema of its own, dropped at the end.
	_, schema := outboxtest.SchemaNamed(t, outboxtest.UniqueName(t, "prov"))
	args := []string{"provider", "--database-url", outboxtest.DatabaseURL(), "--schema", schema,
		"--listen", "127.0.0.1:0", "--control-listen", "127.0.0.1:0", "--fault-seed", "3"}

	first := start(t, append(args, "--fault", "crash:next=1")...)
	m := first.waitLog(providerListening)
	hc := &http.Client{Timeout: 30 * time.Second}
	client := provider.NewClient("http://"+m[1], "http://"+m[2], hc)
	req := provider.ChargeRequest{Reference: "order-1", Amount: 2490, Currency: "eur"}
	if _, err := client.Charge(ctx, "evt-1", req); !errors.Is(err, provider.ErrAmbiguous) {
		t.Fatalf("charge into a crash: %v, want an ambiguous error", err)
	}
	select {
	case <-first.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the provider did not die after the injected crash")
	}
	if ws, ok := first.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("provider exit: %v, want killed by SIGKILL", first.cmd.ProcessState)
	}

	second := start(t, args...)
	m = second.waitLog(providerListening)
	client = provider.NewClient("http://"+m[1], "http://"+m[2], hc)
	ledger, err := client.Ledger(ctx, "order-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(ledger.Entries) != 1 || ledger.Entries[0].IdempotencyKey != "evt-1" {
		t.Fatalf("ledger after the crash: %+v, want the one charge", ledger.Entries)
	}
	retry, err := client.Charge(ctx, "evt-1", req)
	if err != nil || !retry.Replayed || retry.ID != ledger.Entries[0].ID {
		t.Fatalf("retry after the restart: %+v, %v; want the stored charge %s replayed", retry, err, ledger.Entries[0].ID)
	}
	if ledger, err = client.Ledger(ctx, "order-1"); err != nil || len(ledger.Entries) != 1 || ledger.Duplicates != 0 {
		t.Fatalf("ledger after the retry: %+v, %v", ledger, err)
	}

	if _, err := client.SetFaults(ctx, provider.Faults{Rules: []provider.Rule{{Fault: provider.FaultDropResponse, Next: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Charge(ctx, "evt-2", provider.ChargeRequest{Reference: "order-2", Amount: 100, Currency: "eur"}); !errors.Is(err, provider.ErrAmbiguous) {
		t.Fatalf("charge with a dropped response: %v", err)
	}
	st, err := client.Faults(ctx)
	if err != nil || st.Injected[provider.FaultDropResponse] != 1 {
		t.Fatalf("fault status: %+v, %v", st, err)
	}

	// A request hanging in an injected timeout does not hold up a clean
	// shutdown: its connection is closed without a response.
	if _, err := client.SetFaults(ctx, provider.Faults{Rules: []provider.Rule{{Fault: provider.FaultTimeoutAfterCommit, Next: 1}}}); err != nil {
		t.Fatal(err)
	}
	hung := make(chan error, 1)
	go func() {
		_, err := client.Charge(ctx, "evt-3", provider.ChargeRequest{Reference: "order-3", Amount: 100, Currency: "eur"})
		hung <- err
	}()
	outboxtest.Eventually(t, 30*time.Second, "the hanging charge committed", func() bool {
		l, err := client.Ledger(ctx, "order-3")
		return err == nil && len(l.Entries) == 1
	})
	second.stop()
	if err := <-hung; !errors.Is(err, provider.ErrAmbiguous) {
		t.Fatalf("the hanging charge: %v, want an ambiguous error", err)
	}
	if !hasLine(second.lines(), "provider stopped") {
		t.Fatal("the provider did not log its clean stop")
	}
}

// TestProviderUsageErrors: a bad mode or fault is one line and a non-zero
// exit, before anything connects.
func TestProviderUsageErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"provider", "--mode", "sometimes"}, 1, "unknown provider mode"},
		{[]string{"provider", "--fault", "meteor"}, 2, "unknown fault"},
		{[]string{"provider", "--fault", "crash:p=2"}, 2, "not in [0, 1]"},
	} {
		cmd := exec.Command(ordersBinary(t), c.args...)
		cmd.Env = append(os.Environ(), "PROVIDER_FAULTS=", "PROVIDER_MODE=")
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != c.code || !strings.Contains(string(out), c.msg) {
			t.Errorf("orders %v: %v, output %q; want exit %d and %q", c.args, err, out, c.code, c.msg)
		}
	}
}
