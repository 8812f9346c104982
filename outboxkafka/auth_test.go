package outboxkafka_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxkafka"
)

// A distinctive password: no error or String output may contain it.
const (
	rightPassword = "Rt-pw-7f3a9c"
	wrongPassword = "Wr-pw-41be2d"
)

// pki is a self-signed CA and a server and a client certificate it signed,
// the CA and the client's certificate and key written as PEM files.
type pki struct {
	server                    tls.Certificate
	pool                      *x509.CertPool
	caFile, certFile, keyFile string
}

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	caKey := newKey(t)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "outbox test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p := pki{pool: x509.NewCertPool(), caFile: filepath.Join(dir, "ca.pem"),
		certFile: filepath.Join(dir, "client.pem"), keyFile: filepath.Join(dir, "client.key")}
	p.pool.AddCert(ca)
	writePEM(t, p.caFile, "CERTIFICATE", caDER)
	leaf := func(serial int64, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
		key := newKey(t)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "localhost"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, key
	}
	der, key := leaf(2, x509.ExtKeyUsageServerAuth)
	p.server = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	der, key = leaf(3, x509.ExtKeyUsageClientAuth)
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, p.certFile, "CERTIFICATE", der)
	writePEM(t, p.keyFile, "EC PRIVATE KEY", keyDER)
	return p
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// secureCluster starts a kfake cluster with the topic "auth.order" and opts
// (SASL users, TLS), closed when the test ends.
func secureCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(1, "auth.order")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// checkWorks probes and publishes one event with cfg, expecting success.
func checkWorks(t *testing.T, cfg outboxkafka.Config) {
	t.Helper()
	// The callers' short delivery time-out is for the failing cases, which
	// wait for it whole; a publish that works must not fail because the
	// machine is loaded.
	cfg.DeliveryTimeout = time.Minute
	p, err := outboxkafka.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Probe(testCtx(t)); err != nil {
		t.Fatalf("Probe: %v", err)
	}
	checkNil(t, p.Publish(testCtx(t), []outbox.Message{event("o-1", 1)}))
}

// checkUnavailable probes and publishes two events with cfg, expecting each
// to fail as unavailable (not permanent) without showing a password.
func checkUnavailable(t *testing.T, cfg outboxkafka.Config) {
	t.Helper()
	p, err := outboxkafka.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// A client retries a broker that closes the connection until the
	// probe's context ends.
	ctx, cancel := context.WithTimeout(testCtx(t), 3*time.Second)
	defer cancel()
	perr := p.Probe(ctx)
	if !outbox.IsUnavailable(perr) || outbox.IsPermanent(perr) {
		t.Errorf("Probe: %v, want unavailable", perr)
	}
	errs := p.Publish(testCtx(t), []outbox.Message{event("o-1", 1), event("o-2", 1)})
	if len(errs) != 2 {
		t.Fatalf("Publish: %v, want one error per message", errs)
	}
	for i, err := range append(errs, perr) {
		if !outbox.IsUnavailable(err) || outbox.IsPermanent(err) {
			t.Errorf("error %d: %v, want unavailable and not permanent", i, err)
		}
		if err != nil && (strings.Contains(err.Error(), rightPassword) || strings.Contains(err.Error(), wrongPassword)) {
			t.Errorf("error %d: %v shows the password", i, err)
		}
	}
}

// TestSASL: each mechanism authenticates with the right password, and with
// a wrong one Probe and Publish fail as unavailable (the destination cannot
// be used until it is fixed), never showing the password.
func TestSASL(t *testing.T) {
	t.Parallel()
	for _, mech := range []string{outboxkafka.SASLPlain, outboxkafka.SASLScramSHA256, outboxkafka.SASLScramSHA512} {
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			c := secureCluster(t, kfake.EnableSASL(), kfake.Superuser(mech, "relay", rightPassword))
			cfg := outboxkafka.Config{Brokers: c.ListenAddrs(), Topic: "auth.{aggregate_type}", DeliveryTimeout: 2 * time.Second,
				SASLMechanism: mech, User: "relay", Password: rightPassword}
			checkWorks(t, cfg)
			cfg.Password = wrongPassword
			checkUnavailable(t, cfg)
			cfg.Password, cfg.SASLMechanism = "", ""
			cfg.User = ""
			checkUnavailable(t, cfg) // no SASL at all
		})
	}
}

// TestSASLRefusedByBroker: a broker that answers a failed authentication
// with SASL_AUTHENTICATION_FAILED, as Kafka does (kfake closes the
// connection instead), makes Probe fail at once as unavailable, with the
// broker's reason, and Publish fail as unavailable.
func TestSASLRefusedByBroker(t *testing.T) {
	t.Parallel()
	c := secureCluster(t, kfake.EnableSASL(), kfake.Superuser(outboxkafka.SASLPlain, "relay", rightPassword))
	c.ControlKey(int16(kmsg.SASLAuthenticate), func(r kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		resp := r.(*kmsg.SASLAuthenticateRequest).ResponseKind().(*kmsg.SASLAuthenticateResponse)
		resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
		msg := "Authentication failed: Invalid username or password"
		resp.ErrorMessage = &msg
		return resp, nil, true
	})
	cfg := outboxkafka.Config{Brokers: c.ListenAddrs(), Topic: "auth.{aggregate_type}", DeliveryTimeout: 2 * time.Second,
		SASLMechanism: outboxkafka.SASLPlain, User: "relay", Password: wrongPassword}
	p, err := outboxkafka.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Probe(testCtx(t)); !outbox.IsUnavailable(err) || !errors.Is(err, kerr.SaslAuthenticationFailed) {
		t.Fatalf("Probe: %v, want unavailable with SASL_AUTHENTICATION_FAILED", err)
	}
	checkUnavailable(t, cfg)
}

// TestTLS: brokers with a certificate from a private CA are reached with
// CAFile, and fail as unavailable against the system's roots; a broker that
// requires a client certificate takes CertFile and KeyFile.
func TestTLS(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	c := secureCluster(t, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{p.server}}))
	cfg := outboxkafka.Config{Brokers: c.ListenAddrs(), Topic: "auth.{aggregate_type}", DeliveryTimeout: 2 * time.Second}
	checkUnavailable(t, cfg) // plain text to a TLS listener
	cfg.TLS = true
	checkUnavailable(t, cfg) // unknown authority
	cfg.CAFile = p.caFile
	checkWorks(t, cfg)

	mutual := secureCluster(t, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{p.server},
		ClientCAs: p.pool, ClientAuth: tls.RequireAndVerifyClientCert}))
	cfg.Brokers = mutual.ListenAddrs()
	checkUnavailable(t, cfg) // no client certificate
	cfg.CertFile, cfg.KeyFile = p.certFile, p.keyFile
	checkWorks(t, cfg)

	for _, bad := range []outboxkafka.Config{
		{Brokers: cfg.Brokers, CAFile: filepath.Join(t.TempDir(), "none.pem")},
		{Brokers: cfg.Brokers, CAFile: p.keyFile},
		{Brokers: cfg.Brokers, CertFile: p.certFile},
		{Brokers: cfg.Brokers, CertFile: p.certFile, KeyFile: p.caFile},
	} {
		if pub, err := outboxkafka.NewPublisher(bad); err == nil {
			pub.Close()
			t.Errorf("NewPublisher(%v) succeeded", bad)
		}
	}
}

// TestURLWithSASLAndTLS: a URL naming a user, sasl= and tls= with ca_file
// reaches a SASL over TLS cluster, the password taken from
// OUTBOX_KAFKA_PASSWORD.
func TestURLWithSASLAndTLS(t *testing.T) {
	p := newPKI(t)
	c := secureCluster(t, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{p.server}}),
		kfake.EnableSASL(), kfake.Superuser(outboxkafka.SASLScramSHA512, "relay", rightPassword))
	raw := fmt.Sprintf("kafka://relay@%s?sasl=scram-sha-512&tls=true&ca_file=%s&topic=auth.{aggregate_type}&delivery_timeout=2s",
		strings.Join(c.ListenAddrs(), ","), p.caFile)
	t.Setenv(outboxkafka.PasswordEnv, rightPassword)
	cfg, err := outboxkafka.ParseURL(raw)
	if err != nil {
		t.Fatal(err)
	}
	checkWorks(t, cfg)
	t.Setenv(outboxkafka.PasswordEnv, wrongPassword)
	if cfg, err = outboxkafka.ParseURL(raw); err != nil {
		t.Fatal(err)
	}
	checkUnavailable(t, cfg)
}

// TestUnreachableWithPassword: a cluster that does not answer is
// unavailable, and the error does not show the password.
func TestUnreachableWithPassword(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := l.Addr().String()
	l.Close()
	checkUnavailable(t, outboxkafka.Config{Brokers: []string{free}, DeliveryTimeout: time.Second, DialTimeout: 500 * time.Millisecond,
		SASLMechanism: outboxkafka.SASLPlain, User: "relay", Password: rightPassword, TLS: true})
}

// TestConfigStringHidesPassword: %v, %+v, %#v and %s of a Config never
// print the password.
func TestConfigStringHidesPassword(t *testing.T) {
	t.Parallel()
	cfg := outboxkafka.Config{Brokers: []string{"k1:9092"}, SASLMechanism: outboxkafka.SASLPlain, User: "relay", Password: rightPassword}
	for _, f := range []string{"%v", "%+v", "%#v", "%s"} {
		s := fmt.Sprintf(f, cfg)
		if strings.Contains(s, rightPassword) || !strings.Contains(s, "relay") || !strings.Contains(s, "xxxxx") {
			t.Errorf("Sprintf(%q) = %s", f, s)
		}
	}
	if s := fmt.Sprintf("%v", &cfg); strings.Contains(s, rightPassword) {
		t.Errorf("pointer: %s", s)
	}
}

// TestConnectOptions: the options ConnectOptions derives from a URL with
// SASL and mutual TLS reach such a cluster (a consumer's client pings it),
// while a client with the brokers alone does not.
func TestConnectOptions(t *testing.T) {
	p := newPKI(t)
	c := secureCluster(t, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{p.server}, ClientCAs: p.pool, ClientAuth: tls.RequireAndVerifyClientCert}),
		kfake.EnableSASL(), kfake.Superuser(outboxkafka.SASLScramSHA512, "relay", rightPassword))
	t.Setenv(outboxkafka.PasswordEnv, rightPassword)
	cfg, err := outboxkafka.ParseURL(fmt.Sprintf("kafka://relay@%s?sasl=scram-sha-512&ca_file=%s&cert_file=%s&key_file=%s",
		strings.Join(c.ListenAddrs(), ","), p.caFile, p.certFile, p.keyFile))
	if err != nil {
		t.Fatal(err)
	}
	opts, err := cfg.ConnectOptions()
	if err != nil {
		t.Fatal(err)
	}
	// The client that must get in has 30 s (a TLS and SASL handshake on a
	// loaded machine); the one that must not is refused or times out
	// after 3 s, an error either way.
	ping := func(wait time.Duration, opts ...kgo.Opt) error {
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(testCtx(t), wait)
		defer cancel()
		return cl.Ping(ctx)
	}
	if err := ping(30*time.Second, opts...); err != nil {
		t.Fatalf("a client with ConnectOptions: %v", err)
	}
	if err := ping(3*time.Second, kgo.SeedBrokers(c.ListenAddrs()...)); err == nil {
		t.Fatal("a client with the brokers alone reached a SASL over mutual TLS cluster")
	}
}
