package outboxwebhook_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/outboxwebhook"
)

// Security review of issue 19, item 11: a webhook URL's path and query are
// secrets (Slack's /services/T…/B…/<token>, Discord's
// /api/webhooks/<id>/<token>, ?key=…). An endpoint's error page that echoes
// them ("Cannot POST /services/…") must not carry them into the error, and
// so into last_error, the relay's log and the console. Before the fix the
// quoted body kept them.
func TestErrorBodyHidesTheURLsSecrets(t *testing.T) {
	t.Parallel()
	const token = "abcdefghijklmnopqrstuvwx"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Echo what the request named, as many frameworks' 404 pages do.
		http.Error(w, "Cannot POST "+r.URL.RequestURI()+" (token "+token+", key "+r.URL.Query().Get("key")+")", http.StatusNotFound)
	}))
	t.Cleanup(srv.Close)
	p := publisher(t, outboxwebhook.Config{URL: srv.URL + "/services/T0AAAAAAA/B0BBBBBBB/" + token + "?key=q-s3cret-value", Secrets: []string{newSecret(t)}})
	err := publishOne(t, p, message("o-1", 1))
	if err == nil {
		t.Fatal("a 404 was accepted")
	}
	for _, leak := range []string{token, "/services/", "q-s3cret-value"} {
		if strings.Contains(err.Error(), leak) {
			t.Errorf("the error repeats %q: %v", leak, err)
		}
	}
}
