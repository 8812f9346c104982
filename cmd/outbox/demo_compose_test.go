package main

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"go.yaml.in/yaml/v2"

	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/pgcluster"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/outboxamqp"
)

// composeFile is the part of the Compose specification compose.yaml uses;
// parsing it strictly refuses any other key, so a key this test does not
// know about is noticed.
type composeFile struct {
	Name     string                    `yaml:"name"`
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Hostname    string            `yaml:"hostname"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	Healthcheck struct {
		Test        []string `yaml:"test"`
		Interval    string   `yaml:"interval"`
		Timeout     string   `yaml:"timeout"`
		Retries     int      `yaml:"retries"`
		StartPeriod string   `yaml:"start_period"`
	} `yaml:"healthcheck"`
}

// publishes reports whether s publishes its container port on host:port
// ("host:port:container").
func (s composeService) publishes(host string, port, container int) bool {
	return slices.Contains(s.Ports, fmt.Sprintf("%s:%d:%d", host, port, container))
}

// TestComposeMatchesTheTests parses compose.yaml (no Docker engine runs
// where CI does, so it cannot be started here) and checks that its
// services are on the addresses, with the credentials and databases, the
// tests and the demo default to, and that each has a health check (what
// "docker compose up -d --wait" waits for).
func TestComposeMatchesTheTests(t *testing.T) {
	t.Setenv("RABBITMQ_URL", "") // rabbittest.URL's default
	b, err := os.ReadFile(filepath.Join("..", "..", "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var f composeFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	if got := slices.Sorted(func(yield func(string) bool) {
		for k := range f.Services {
			if !yield(k) {
				return
			}
		}
	}); !slices.Equal(got, []string{"nats", "postgres", "rabbitmq"}) {
		t.Errorf("services %v, want nats, postgres, rabbitmq", got)
	}
	for name, s := range f.Services {
		hc := s.Healthcheck
		if len(hc.Test) < 2 || (hc.Test[0] != "CMD" && hc.Test[0] != "CMD-SHELL") || hc.Retries < 1 || hc.Interval == "" {
			t.Errorf("%s: no usable health check: %+v", name, hc)
		}
		if !regexp.MustCompile(`:\d+(\.\d+)*(-[a-z]+)?$`).MatchString(s.Image) {
			t.Errorf("%s: image %q is not pinned to a version", name, s.Image)
		}
	}
	// NATS: the version the tests embed; RabbitMQ: a minor version.
	mod, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*github\.com/nats-io/nats-server/v2 v(\S+)$`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod has no nats-server")
	}
	if want := "nats:" + string(m[1]) + "-alpine"; f.Services["nats"].Image != want {
		t.Errorf("nats: image %q, want %q (go.mod's nats-server)", f.Services["nats"].Image, want)
	}
	if img := f.Services["rabbitmq"].Image; !regexp.MustCompile(`^rabbitmq:\d+\.\d+`).MatchString(img) {
		t.Errorf("rabbitmq: image %q is not pinned to a minor version", img)
	}

	// PostgreSQL: the tests' and the demo's default URL.
	if cli.DatabaseURLDefault != outboxtest.DatabaseURLDefault {
		t.Errorf("the demo's default database %s is not the tests' %s", cli.DatabaseURLDefault, outboxtest.DatabaseURLDefault)
	}
	pg, err := pgconn.ParseConfig(outboxtest.DatabaseURLDefault)
	if err != nil {
		t.Fatal(err)
	}
	s := f.Services["postgres"]
	if !s.publishes(pg.Host, int(pg.Port), 5432) {
		t.Errorf("postgres: ports %v do not publish 5432 on %s:%d", s.Ports, pg.Host, pg.Port)
	}
	env := s.Environment
	if user := orDefault(env["POSTGRES_USER"], "postgres"); user != pg.User {
		t.Errorf("postgres: user %q, the tests connect as %q", user, pg.User)
	}
	if db := orDefault(env["POSTGRES_DB"], orDefault(env["POSTGRES_USER"], "postgres")); db != pg.Database {
		t.Errorf("postgres: database %q, the tests use %q", db, pg.Database)
	}
	switch {
	case pg.Password == "" && env["POSTGRES_HOST_AUTH_METHOD"] != "trust":
		t.Errorf("postgres: the tests connect without a password, so POSTGRES_HOST_AUTH_METHOD must be trust, not %q", env["POSTGRES_HOST_AUTH_METHOD"])
	case pg.Password != "" && env["POSTGRES_PASSWORD"] != pg.Password:
		t.Error("postgres: POSTGRES_PASSWORD is not the tests' password")
	}
	// The docker run that pgcluster's error offers is the same server.
	if want := fmt.Sprintf("-p %s:%d:5432 -e POSTGRES_HOST_AUTH_METHOD=trust %s", pg.Host, pg.Port, s.Image); !strings.Contains(pgcluster.ErrNoBinaries.Error(), want) {
		t.Errorf("pgcluster.ErrNoBinaries does not offer %q", want)
	}

	// NATS with JetStream.
	n, err := url.Parse(outboxtest.NATSURLDefault)
	if err != nil {
		t.Fatal(err)
	}
	s = f.Services["nats"]
	if !s.publishes(n.Hostname(), atoi(t, n.Port()), 4222) {
		t.Errorf("nats: ports %v do not publish 4222 on %s", s.Ports, n.Host)
	}
	if !slices.Contains(s.Command, "-js") && !slices.Contains(s.Command, "--jetstream") {
		t.Errorf("nats: command %v does not enable JetStream", s.Command)
	}

	// RabbitMQ: the tests' and the demo's broker.
	for _, u := range []string{rabbittest.URL(), outboxamqp.URLDefault} {
		a, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		s = f.Services["rabbitmq"]
		if !s.publishes(a.Hostname(), atoi(t, a.Port()), 5672) {
			t.Errorf("rabbitmq: ports %v do not publish 5672 on %s", s.Ports, a.Host)
		}
		pass, _ := a.User.Password()
		if orDefault(s.Environment["RABBITMQ_DEFAULT_USER"], "guest") != a.User.Username() || orDefault(s.Environment["RABBITMQ_DEFAULT_PASS"], "guest") != pass {
			t.Errorf("rabbitmq: its user is not the one of %s", u)
		}
		if vhost := orDefault(s.Environment["RABBITMQ_DEFAULT_VHOST"], "/"); vhost != orDefault(strings.TrimPrefix(a.Path, "/"), "/") {
			t.Errorf("rabbitmq: vhost %q, %s uses %q", vhost, u, a.Path)
		}
	}
}

// orDefault returns v, or def when v is empty (the image's default).
func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
