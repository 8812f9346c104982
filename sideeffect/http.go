package sideeffect

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
)

// MaxHTTPResponseBytes bounds the response body HTTPOutcome reads and
// records.
const MaxHTTPResponseBytes = 1 << 20

// HTTPOutcome classifies the result of an HTTP call (what http.Client.Do
// returned) the way a Call returns it, conservatively: when in doubt, the
// outcome is ambiguous. It reads and closes the response body.
//
//   - 2xx: succeeded, the body is the response;
//   - 429 Too Many Requests: the provider did not process it: NotSent;
//   - 408, 409 (the key is in use by a concurrent request) and 5xx: ambiguous;
//   - other 4xx: Rejected, the body recorded;
//   - a failure to connect (dial, DNS): NotSent; any other transport error
//     (a timeout, a reset after the request was written): ambiguous.
//
// Use it from a Call after building the request with the key; for a
// provider that ignores keys, see the package documentation on net/http
// replaying requests.
func HTTPOutcome(resp *http.Response, err error) ([]byte, error) {
	if err != nil {
		var op *net.OpError
		var dns *net.DNSError
		if (errors.As(err, &op) && op.Op == "dial") || errors.As(err, &dns) {
			return nil, NotSent(err)
		}
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxHTTPResponseBytes))
	if err != nil {
		return nil, fmt.Errorf("read the response (%s): %w", resp.Status, err)
	}
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return body, nil
	case c == http.StatusTooManyRequests:
		return nil, NotSent(fmt.Errorf("provider: %s", resp.Status))
	case c == http.StatusRequestTimeout || c == http.StatusConflict || c >= 500:
		return nil, fmt.Errorf("provider: %s", resp.Status)
	case c >= 400:
		return body, Rejected(fmt.Errorf("provider refused: %s", resp.Status))
	}
	return nil, fmt.Errorf("provider: unexpected %s", resp.Status)
}
