package sideeffect_test

import (
	"context"
	"encoding/json"
	"net/url"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/examples/orders/provider"
	"github.com/pgoutbox/outbox/internal/cutproxy"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/sideeffect"
)

// proxiedPool is a pool to the test database through p, its sessions named
// app (application_name), so that a test can find and end them.
func proxiedPool(t *testing.T, p *cutproxy.Proxy, app string) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.Addr()
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestOutcomeRecordSurvivesALostConnection loses the connection the outcome
// of a charge is being written on, after the provider charged: once after
// the write committed (the server's answer is cut on its way back), once
// before it (the session is terminated during the call, as a failover or
// pg_terminate_backend would). Do must record the charge on another
// connection within its lease and report it succeeded: before, it returned
// the connection's error and, in the second case, left the attempt started,
// to be asked about again or, in mode neither, called again.
func TestOutcomeRecordSurvivesALostConnection(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		p provider.Mode
		s sideeffect.Mode
	}{{provider.ModeIdempotent, sideeffect.Idempotent}, {provider.ModeQueryable, sideeffect.Queryable}, {provider.ModeNeither, sideeffect.Neither}} {
		for _, cut := range []string{"answer lost", "session ended"} {
			t.Run(string(mode.p)+"/"+cut, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				admin, schema := outboxtest.Schema(t)
				prov := startProvider(t, schema, mode.p)
				proxy := cutproxy.New(t, hostPort(t, outboxtest.DatabaseURL()))
				app := outboxtest.UniqueName(t, "se")
				pool := proxiedPool(t, proxy, app)
				caller, err := sideeffect.New(pool, sideeffect.Config{Name: "payments.charge", Schema: schema, Mode: mode.s,
					Lookup: prov.lookup(mode.p), CallTimeout: 5 * time.Second, Lease: 20 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				key := uuid.NewString()
				req := provider.ChargeRequest{Reference: key, Amount: 990, Currency: "eur"}
				body, _ := json.Marshal(req)
				charge := prov.charge(req)
				call := func(ctx context.Context, k string) ([]byte, error) {
					resp, err := charge(ctx, k)
					switch cut {
					case "answer lost":
						proxy.CutReplyContaining([]byte("UPDATE 1\x00"))
					case "session ended":
						if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app); err != nil {
							t.Error(err)
						}
						outboxtest.Eventually(t, 10*time.Second, "sessions ended", func() bool {
							var n int
							_ = admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n)
							return n == 0
						})
					}
					return resp, err
				}
				res, err := caller.Do(ctx, key, body, call)
				if err != nil || res.State != sideeffect.Succeeded {
					t.Fatalf("Do after a charge whose record lost its connection: state %s, %v; want succeeded", res.State, err)
				}
				if cut == "answer lost" && proxy.Cuts() != 1 {
					t.Fatalf("%d answers cut, want 1", proxy.Cuts())
				}
				sa, err := sideeffect.NewAdmin(admin, sideeffect.AdminConfig{Schema: schema})
				if err != nil {
					t.Fatal(err)
				}
				a, err := sa.Attempt(ctx, "payments.charge", key)
				if err != nil || a.State != sideeffect.Succeeded {
					t.Fatalf("attempt %+v, %v; want succeeded", a, err)
				}
				again, err := caller.Do(ctx, key, body, call)
				if err != nil || again.State != sideeffect.Succeeded || again.Called {
					t.Fatalf("the redelivery's Do: state %s, called %v, %v; want the recorded success, no call", again.State, again.Called, err)
				}
				if n := prov.charges(t, key); n != 1 {
					t.Fatalf("%d charges at the provider, want 1", n)
				}
			})
		}
	}
}

func hostPort(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}
