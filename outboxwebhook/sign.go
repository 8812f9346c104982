package outboxwebhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
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
	// webhook-signature header is missing, repeated or malformed.
	ErrNoSignature = errors.New("missing or malformed webhook signature headers")
	// ErrBadSignature: no v1 signature matches any of the secrets.
	ErrBadSignature = errors.New("no signature matches")
	// ErrTimestamp: webhook-timestamp is outside the tolerance.
	ErrTimestamp = errors.New("webhook timestamp outside the tolerance")
	// ErrUnsignedAttributes: a binary-mode request whose ce- headers are
	// not signed (no webhook-outbox-signature, or none that matches). Its
	// body may be genuine, but the attributes that say which event it is
	// are not: it is refused.
	ErrUnsignedAttributes = errors.New("the CloudEvents attributes (ce- headers) are not signed")
	// ErrIDMismatch: the signed webhook-id is not the delivery id of the
	// event the request carries (see DeliveryID).
	ErrIDMismatch = errors.New("webhook-id does not match the event")
	// ErrModeMismatch: the request's content mode (its Content-Type) is not
	// the one the receiver accepts. The signature of the body does not
	// cover the mode, so a receiver never takes it from the request.
	ErrModeMismatch = errors.New("the request's content mode is not the receiver's")
)

// ToleranceDefault is how far webhook-timestamp may be from the
// receiver's clock, either way.
const ToleranceDefault = 5 * time.Minute

// verifier checks Standard Webhooks signatures, and in binary mode the
// signature of the attributes.
type verifier struct {
	keys      [][]byte
	tolerance time.Duration
	mode      Mode // the content mode accepted
}

// Verify checks the signatures of a request's header and body, for a
// receiver that accepts mode (Structured when empty):
// webhook-timestamp must be within tolerance of now (ToleranceDefault when
// tolerance is zero) and one of the v1 signatures in webhook-signature
// must match one of the secrets (compared in constant time). The content
// mode must be mode: Content-Type application/cloudevents+json in
// structured mode, any other in binary mode (ErrModeMismatch otherwise).
// The mode is the receiver's to choose, never the request's: the
// Standard Webhooks signature covers the body only, and a captured
// binary-mode request whose Content-Type is changed to structured mode
// would otherwise have its payload read as the event's attributes. In
// binary mode, one of the v1 signatures in webhook-outbox-signature must
// match too: it covers the ce- headers, Content-Type and the event's own
// headers (see the package documentation). It returns nil or an error
// wrapping ErrNoSignature, ErrTimestamp, ErrBadSignature, ErrModeMismatch
// or ErrUnsignedAttributes; a malformed secret is an error that does not
// repeat it.
//
// Verify does not check that webhook-id names the event: Decode does
// (ErrIDMismatch). Call both, as a Receiver does.
func Verify(secrets []string, mode Mode, header http.Header, body []byte, tolerance time.Duration, now time.Time) error {
	keys, err := parseSecrets(secrets)
	if err != nil {
		return err
	}
	if len(keys) == 0 {
		return errors.New("outboxwebhook: no signing secret")
	}
	if mode, err = parseMode(string(mode)); err != nil {
		return fmt.Errorf("outboxwebhook: %w", err)
	}
	if tolerance <= 0 {
		tolerance = ToleranceDefault
	}
	_, err = verifier{keys: keys, tolerance: tolerance, mode: mode}.verify(header, body, now.Unix())
	return err
}

// single returns the value of a header that must appear exactly once.
func single(header http.Header, key string) (string, bool) {
	vs := header.Values(key)
	if len(vs) != 1 || vs[0] == "" {
		return "", false
	}
	return vs[0], true
}

// verify checks the request's signatures at now (Unix seconds) and returns
// its webhook-id and webhook-timestamp.
func (v verifier) verify(header http.Header, body []byte, now int64) (signed, error) {
	id, okID := single(header, HeaderWebhookID)
	tsText, okTS := single(header, HeaderWebhookTimestamp)
	sigs := header.Values(HeaderWebhookSignature)
	if !okID || !okTS || len(sigs) == 0 {
		return signed{}, fmt.Errorf("outboxwebhook: %w", ErrNoSignature)
	}
	ts, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return signed{}, fmt.Errorf("outboxwebhook: webhook-timestamp %q: %w", tsText, ErrNoSignature)
	}
	tol := int64(v.tolerance / time.Second)
	if ts < now-tol || ts > now+tol {
		return signed{}, fmt.Errorf("outboxwebhook: webhook-timestamp %d is %ds from now, over %s: %w", ts, now-ts, v.tolerance, ErrTimestamp)
	}
	if !v.match(sigs, func(k []byte) string { return signature(k, id, ts, body) }) {
		return signed{}, fmt.Errorf("outboxwebhook: %w", ErrBadSignature)
	}
	if structured := isStructured(header); structured != (v.mode == Structured) {
		return signed{}, fmt.Errorf("outboxwebhook: a %s-mode request (Content-Type %q) at a receiver of %s mode: %w",
			modeOf(structured), header.Get(HeaderContentType), v.mode, ErrModeMismatch)
	}
	if v.mode == Binary {
		asigs := header.Values(HeaderOutboxSignature)
		if len(asigs) == 0 {
			return signed{}, fmt.Errorf("outboxwebhook: binary mode without %s: %w", HeaderOutboxSignature, ErrUnsignedAttributes)
		}
		canon := canonicalHeaders(header)
		if !v.match(asigs, func(k []byte) string { return attributesSignature(k, id, ts, canon, body) }) {
			return signed{}, fmt.Errorf("outboxwebhook: no %s matches: %w", HeaderOutboxSignature, ErrUnsignedAttributes)
		}
	}
	return signed{id: id, ts: ts}, nil
}

// modeOf names the content mode of a request whose Content-Type is (or
// is not) structured mode's.
func modeOf(structured bool) Mode {
	if structured {
		return Structured
	}
	return Binary
}

// signed is what a verified request's signature vouches for besides its
// content: its delivery id and timestamp.
type signed struct {
	id string
	ts int64
}

// match reports whether one of the v1 signatures in the header lines sigs
// is sign(k) for one of the keys, comparing in constant time.
func (v verifier) match(sigs []string, sign func(k []byte) string) bool {
	want := make([][]byte, len(v.keys))
	for i, k := range v.keys {
		want[i] = []byte(sign(k))
	}
	for _, line := range sigs {
		for _, sig := range strings.Fields(line) {
			if !strings.HasPrefix(sig, "v1,") {
				continue // another scheme (v1a, ...)
			}
			for _, w := range want {
				if hmac.Equal([]byte(sig), w) {
					return true
				}
			}
		}
	}
	return false
}

// attributesSignature returns "v1,<base64 HMAC-SHA256(key,
// id.timestamp.canon + "\n" + body)>", the webhook-outbox-signature of a
// binary-mode request whose canonical headers are canon.
func attributesSignature(key []byte, id string, ts int64, canon string, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write(strconv.AppendInt(nil, ts, 10))
	mac.Write([]byte{'.'})
	mac.Write([]byte(canon))
	mac.Write([]byte{'\n'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

func signAttributesAll(keys [][]byte, id string, ts int64, canon string, body []byte) string {
	sigs := make([]string, len(keys))
	for i, k := range keys {
		sigs[i] = attributesSignature(k, id, ts, canon, body)
	}
	return strings.Join(sigs, " ")
}

// canonicalHeaders is the text webhook-outbox-signature signs of a
// binary-mode request's header: one line "name:value\n" per value, for
// every header whose name starts with "ce-", for Content-Type, and for
// every header named in ce-outboxheaders; names in lower case, sorted
// bytewise, each name's values in the order the request carries them,
// values exactly as carried (percent-encoding included). A name listed
// twice, or in several spellings, is one name.
func canonicalHeaders(header http.Header) string {
	wanted := map[string]bool{}
	for _, line := range header.Values(HeaderHeaderNames) {
		for _, n := range strings.Split(line, ",") {
			if n != "" {
				wanted[strings.ToLower(n)] = true
			}
		}
	}
	// The keys of each lower-case name: one, the canonical one, in a
	// request a server parsed; sorted, should a hand-built one hold more.
	keys := map[string][]string{}
	for k := range header {
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "ce-") || lk == HeaderContentType || wanted[lk] {
			keys[lk] = append(keys[lk], k)
		}
	}
	names := make([]string, 0, len(keys))
	for n := range keys {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		ks := keys[n]
		sort.Strings(ks)
		for _, k := range ks {
			for _, v := range header[k] {
				b.WriteString(n)
				b.WriteByte(':')
				b.WriteString(v)
				b.WriteByte('\n')
			}
		}
	}
	return b.String()
}
