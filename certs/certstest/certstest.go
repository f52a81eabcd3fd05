// Package certstest issues throwaway certificates for tests: a CA, and
// server or client certificates signed by it, as PEM files in a test's
// temporary directory.
package certstest

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

// CA issues certificates. Its own certificate is valid from an hour ago
// for a day.
type CA struct {
	Cert *x509.Certificate
	PEM  []byte
	key  *ecdsa.PrivateKey
}

// Issued is a certificate a CA issued, with its key, as PEM.
type Issued struct {
	CertPEM, KeyPEM []byte
	Serial          *big.Int
	Name            string
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return key
}

func newSerial(tb testing.TB) *big.Int {
	tb.Helper()
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		tb.Fatal(err)
	}
	return serial
}

// NewCA returns a CA whose subject is CN=name.
func NewCA(tb testing.TB, name string) *CA {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber:          newSerial(tb),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return &CA{Cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Issue returns a server certificate for 127.0.0.1 and localhost, or a
// client certificate, with subject CN=name.
func (ca *CA) Issue(tb testing.TB, name string, server bool) Issued {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber: newSerial(tb),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(12 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	return Issued{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		Serial:  tmpl.SerialNumber,
		Name:    name,
	}
}

// Subject is the certificate's subject as crypto/x509 prints it.
func (c Issued) Subject() string { return "CN=" + c.Name }

// TLSCert is the certificate and key as crypto/tls uses them.
func (c Issued) TLSCert(tb testing.TB) tls.Certificate {
	tb.Helper()
	cert, err := tls.X509KeyPair(c.CertPEM, c.KeyPEM)
	if err != nil {
		tb.Fatal(err)
	}
	return cert
}

// Write writes the certificate and key to dir/NAME.pem and
// dir/NAME-key.pem and returns both paths.
func (c Issued) Write(tb testing.TB, dir string) (cert, key string) {
	tb.Helper()
	cert, key = filepath.Join(dir, c.Name+".pem"), filepath.Join(dir, c.Name+"-key.pem")
	WriteFile(tb, cert, c.CertPEM)
	WriteFile(tb, key, c.KeyPEM)
	return cert, key
}

// WriteFile replaces path atomically, the way a careful tool does: write a
// temporary file in the same directory, then rename it over path.
func WriteFile(tb testing.TB, path string, data []byte) {
	tb.Helper()
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		tb.Fatal(err)
	}
}
