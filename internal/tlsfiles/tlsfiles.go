// Package tlsfiles loads the TLS files every destination takes the same
// way: a CA certificate to verify the server with (ca_file) and a client
// certificate with its key (cert_file, key_file), PEM. Errors name the
// option and the file, never a key's content.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// Files are the PEM files of a TLS client. Every field is optional, but
// Cert and Key go together.
type Files struct {
	CA, Cert, Key string
	// Prefix is put before the option names in errors ("outbox_" for the
	// webhook's outbox_ca_file, ...).
	Prefix string
}

// Set reports whether any file is named.
func (f Files) Set() bool { return f.CA != "" || f.Cert != "" || f.Key != "" }

// Config returns base (cloned; a new one with TLS 1.2 at least when nil)
// with the CA as its only roots and the client certificate added, after
// reading and checking every file. Without files it returns the clone.
func (f Files) Config(base *tls.Config) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if base != nil {
		tc = base.Clone()
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, fmt.Errorf("%scert_file and %skey_file go together (a client certificate and its key)", f.Prefix, f.Prefix)
	}
	if f.CA != "" {
		pem, err := f.read("ca_file", f.CA)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%sca_file %s: no PEM certificate in it", f.Prefix, f.CA)
		}
		tc.RootCAs = pool
	}
	if f.Cert != "" {
		certPEM, err := f.read("cert_file", f.Cert)
		if err != nil {
			return nil, err
		}
		keyPEM, err := f.read("key_file", f.Key)
		if err != nil {
			return nil, err
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			// X509KeyPair's errors describe, never quote, the key.
			return nil, fmt.Errorf("%scert_file %s with %skey_file %s: %w", f.Prefix, f.Cert, f.Prefix, f.Key, err)
		}
		tc.Certificates = append(tc.Certificates, cert)
	}
	return tc, nil
}

// Check reads and checks the files, as Config does, for a URL parser to
// refuse a bad one at once.
func (f Files) Check() error {
	_, err := f.Config(nil)
	return err
}

func (f Files) read(option, path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is named once, below
		}
		return nil, fmt.Errorf("%s%s %s: %w", f.Prefix, option, path, err)
	}
	return b, nil
}
