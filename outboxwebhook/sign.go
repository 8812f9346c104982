package outboxwebhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// EnvSecret is the environment variable NewPublisher reads the signing
// secrets from when Config.Secrets is empty: one or more "whsec_..."
// secrets separated by spaces or commas.
const EnvSecret = "OUTBOX_WEBHOOK_SECRET"

// MinSecretBytes is the shortest signing key accepted (the decoded part of
// a secret); Standard Webhooks asks for 24 to 64 random bytes.
const MinSecretBytes = 24

// secretPrefix starts a Standard Webhooks secret; the rest is base64.
const secretPrefix = "whsec_"

// SecretsFromEnv returns the secrets in EnvSecret (see SplitSecrets); none
// when it is unset or blank.
func SecretsFromEnv() []string { return SplitSecrets(os.Getenv(EnvSecret)) }

// SplitSecrets splits a list of secrets separated by spaces or commas.
func SplitSecrets(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' })
}

// parseSecrets decodes each secret ("whsec_" and standard base64; the
// prefix may be left out) into an HMAC key. Errors name a secret by its
// position, never by its text.
func parseSecrets(secrets []string) ([][]byte, error) {
	keys := make([][]byte, 0, len(secrets))
	for i, s := range secrets {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(strings.TrimSpace(s), secretPrefix))
		switch {
		case err != nil:
			return nil, fmt.Errorf("outboxwebhook: signing secret %d of %d is malformed: want whsec_ followed by standard base64", i+1, len(secrets))
		case len(key) < MinSecretBytes:
			return nil, fmt.Errorf("outboxwebhook: signing secret %d of %d is too short: %d bytes after base64 decoding, want at least %d", i+1, len(secrets), len(key), MinSecretBytes)
		}
		keys = append(keys, key)
	}
	return keys, nil
}

// signature returns "v1,<base64 HMAC-SHA256(key, id.timestamp.body)>".
func signature(key []byte, id string, ts int64, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write(strconv.AppendInt(nil, ts, 10))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// Sign returns the Standard Webhooks webhook-signature value of a message
// id, timestamp and body: one "v1,<signature>" per secret, separated by
// spaces. It is what the Publisher sends; use it to test a receiver.
func Sign(secrets []string, id string, ts time.Time, body []byte) (string, error) {
	keys, err := parseSecrets(secrets)
	if err != nil {
		return "", err
	}
	if len(keys) == 0 {
		return "", errors.New("outboxwebhook: no signing secret")
	}
	return signAll(keys, id, ts.Unix(), body), nil
}

func signAll(keys [][]byte, id string, ts int64, body []byte) string {
	sigs := make([]string, len(keys))
	for i, k := range keys {
		sigs[i] = signature(k, id, ts, body)
	}
	return strings.Join(sigs, " ")
}

// Verification errors, wrapped by the errors of Verify.
var (
	// ErrNoSignature: the webhook-id, webhook-timestamp or
	// webhook-signature header is missing or malformed.
	ErrNoSignature = errors.New("missing or malformed webhook signature headers")
	// ErrBadSignature: no v1 signature matches any of the secrets.
	ErrBadSignature = errors.New("no signature matches")
	// ErrTimestamp: webhook-timestamp is outside the tolerance.
	ErrTimestamp = errors.New("webhook timestamp outside the tolerance")
)

// ToleranceDefault is how far webhook-timestamp may be from the
// receiver's clock, either way.
const ToleranceDefault = 5 * time.Minute

// verifier checks Standard Webhooks signatures.
type verifier struct {
	keys      [][]byte
	tolerance time.Duration
	now       func() time.Time
}

// Verify checks the Standard Webhooks signature of a request's header and
// body: webhook-timestamp must be within tolerance of now (ToleranceDefault
// when tolerance is zero) and one of the v1 signatures in
// webhook-signature must match one of the secrets (compared in constant
// time). It returns nil or an error wrapping ErrNoSignature, ErrTimestamp
// or ErrBadSignature; a malformed secret is an error that does not repeat
// it.
func Verify(secrets []string, header http.Header, body []byte, tolerance time.Duration, now time.Time) error {
	keys, err := parseSecrets(secrets)
	if err != nil {
		return err
	}
	if len(keys) == 0 {
		return errors.New("outboxwebhook: no signing secret")
	}
	if tolerance <= 0 {
		tolerance = ToleranceDefault
	}
	return verifier{keys: keys, tolerance: tolerance, now: func() time.Time { return now }}.verify(header, body)
}

func (v verifier) verify(header http.Header, body []byte) error {
	id, tsText, sigs := header.Get(HeaderWebhookID), header.Get(HeaderWebhookTimestamp), header.Values(HeaderWebhookSignature)
	if id == "" || tsText == "" || len(sigs) == 0 {
		return fmt.Errorf("outboxwebhook: %w", ErrNoSignature)
	}
	ts, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return fmt.Errorf("outboxwebhook: webhook-timestamp %q: %w", tsText, ErrNoSignature)
	}
	now := v.now().Unix()
	tol := int64(v.tolerance / time.Second)
	if ts < now-tol || ts > now+tol {
		return fmt.Errorf("outboxwebhook: webhook-timestamp %d is %ds from now, over %s: %w", ts, now-ts, v.tolerance, ErrTimestamp)
	}
	want := make([][]byte, len(v.keys))
	for i, k := range v.keys {
		want[i] = []byte(signature(k, id, ts, body))
	}
	for _, line := range sigs {
		for _, sig := range strings.Fields(line) {
			if !strings.HasPrefix(sig, "v1,") {
				continue // another scheme (v1a, ...)
			}
			for _, w := range want {
				if hmac.Equal([]byte(sig), w) {
					return nil
				}
			}
		}
	}
	return fmt.Errorf("outboxwebhook: %w", ErrBadSignature)
}
