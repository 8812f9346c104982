package outboxconsole_test

import (
	"context"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/outboxconsole"
)

// Example mounts the console in a server of your own, on loopback, with
// the token from the environment: what `outbox console` does.
func Example() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	h, err := outboxconsole.New(outboxconsole.Config{
		Pool:   pool,
		Schema: "outbox",
		// Without a token (or with ReadOnly) the console only shows.
		Token: os.Getenv("OUTBOX_CONSOLE_TOKEN"),
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Addr: "127.0.0.1:8089", Handler: h, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
