package main

// outbox healthcheck: a container's HEALTHCHECK without curl or wget. The
// image (deploy/docker/Dockerfile) is FROM scratch: no shell, no tools, only
// this binary, which asks the relay's own /healthz.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/pgoutbox/outbox/internal/cli"
)

const healthcheckUsage = `healthcheck [--url URL] [--timeout 5s]

Asks URL and exits 0 when it answers 2xx within --timeout, 1 otherwise with one line saying
why: a container's HEALTHCHECK in an image without curl or wget (deploy/docker/Dockerfile,
FROM scratch). The default URL is /healthz at OUTBOX_METRICS_ADDR, the address the relay's
--metrics-addr serves (on 127.0.0.1 when it listens on all addresses); /readyz asks whether the
relay is ready instead of alive. It does not touch the database.`

func runHealthcheck(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "healthcheck", healthcheckUsage)
	rawURL := fs.String("url", "", "the `URL` to ask (default: http://<OUTBOX_METRICS_ADDR>/healthz)")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *timeout <= 0 {
		return cli.Usagef(fs, "--timeout %s is not positive", *timeout)
	}
	target := *rawURL
	if target == "" {
		var err error
		if target, err = metricsURL(os.Getenv("OUTBOX_METRICS_ADDR"), "/healthz"); err != nil {
			return cli.Usagef(fs, "%v", err)
		}
	}
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return cli.Usagef(fs, "--url %q is not an http(s) URL", target)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // the URL is said once, below
		}
		return fmt.Errorf("%s: %w", u.Redacted(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		return nil
	}
	// The first line of the body says why (/readyz: "not ready: waiting
	// for the database: ..."), at most 200 bytes of it.
	line, _ := bufio.NewReader(io.LimitReader(resp.Body, 200)).ReadString('\n')
	return fmt.Errorf("%s: %s: %s", u.Redacted(), resp.Status, strings.TrimSpace(line))
}

// metricsURL is the URL of path on the server --metrics-addr (addr) runs:
// host:port, with 127.0.0.1 for an empty or unspecified host.
func metricsURL(addr, path string) (string, error) {
	if addr == "" {
		return "", errors.New("give --url, or set OUTBOX_METRICS_ADDR (the relay's --metrics-addr, e.g. :9464)")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("OUTBOX_METRICS_ADDR %q is not host:port: %v", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + path, nil
}
