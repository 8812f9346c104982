// Package testcert makes throwaway certificates for tests of TLS: a
// certificate authority, server certificates for 127.0.0.1 and localhost,
// and client certificates for a user name, written as PEM files into a
// directory of the test's own. Keys are ECDSA P-256; certificates are valid
// from an hour ago for a day.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority that signs the certificates it makes.
type CA struct {
	// CertFile is the CA certificate, PEM.
	CertFile string
	// Pool holds the CA certificate, for a tls.Config's RootCAs or ClientCAs.
	Pool *x509.CertPool

	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// Pair is a certificate and its private key, as PEM files.
type Pair struct {
	CertFile, KeyFile string
}

// TLS returns the pair loaded for a tls.Config's Certificates.
func (p Pair) TLS(t testing.TB) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(p.CertFile, p.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// NewCA makes a certificate authority named name, its files in a new
// temporary directory of the test's.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	dir := t.TempDir()
	key := newKey(t)
	tmpl := template(t, name)
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{dir: dir, cert: cert, key: key, Pool: x509.NewCertPool()}
	ca.Pool.AddCert(cert)
	ca.CertFile = filepath.Join(dir, name+"-ca.crt")
	writePEM(t, ca.CertFile, "CERTIFICATE", der)
	return ca
}

// Server makes a server certificate for 127.0.0.1, ::1 and localhost, named
// name (the files are name.crt and name.key).
func (ca *CA) Server(t testing.TB, name string) Pair {
	t.Helper()
	tmpl := template(t, name)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	tmpl.DNSNames = []string{"localhost"}
	return ca.sign(t, name, tmpl)
}

// Client makes a client certificate whose common name is user (PostgreSQL
// maps it to the database user), named name.
func (ca *CA) Client(t testing.TB, name, user string) Pair {
	t.Helper()
	tmpl := template(t, user)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return ca.sign(t, name, tmpl)
}

func (ca *CA) sign(t testing.TB, name string, tmpl *x509.Certificate) Pair {
	t.Helper()
	key := newKey(t)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	p := Pair{CertFile: filepath.Join(ca.dir, name+".crt"), KeyFile: filepath.Join(ca.dir, name+".key")}
	writePEM(t, p.CertFile, "CERTIFICATE", der)
	writePEM(t, p.KeyFile, "PRIVATE KEY", keyDER)
	return p
}

// Copy copies the file src to dst with permissions perm (PostgreSQL wants
// its server key 0600 and owned by itself).
func Copy(t testing.TB, src, dst string, perm os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, perm); err != nil {
		t.Fatal(err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func template(t testing.TB, cn string) *x509.Certificate {
	t.Helper()
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
	}
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
