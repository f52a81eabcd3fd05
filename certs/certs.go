// Package certs serves TLS with a certificate, key and optional client CA
// bundle read from files, and reloads them when the files change.
//
// Certificates are rotated by rewriting files: cert-manager updates a
// Kubernetes Secret volume by swapping its "..data" symlink, other tools
// rename a new file over the old one. A Reloader lets the server pick up the
// new identity for new connections without a restart; established
// connections keep the one they were handshaken with.
//
// A reload that fails (a half-written file, a key that does not match its
// certificate) keeps the previous files in force, so a bad rotation never
// leaves a running server without a certificate. Only the first load, in
// New, is fatal.
package certs

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Files names the PEM files of a server identity and, optionally, the CA
// bundle that client certificates must chain to (mutual TLS).
type Files struct {
	Cert string // certificate, followed by any intermediates
	Key  string // private key of the first certificate
	// ClientCA, when set, makes client certificates mandatory: a client
	// must present one that chains to a certificate of this bundle.
	ClientCA string
}

// Stats describes the reloads of a Reloader and the certificate in force.
// A reload that finds the files unchanged is not counted.
type Stats struct {
	OK, Failed uint64 // the load done by New counts as one OK
	// LastError is the error of the last reload when it failed; it is
	// cleared once the files are valid again.
	LastError   string
	LastOK      time.Time
	LastAttempt time.Time
	NotAfter    time.Time // of the certificate in force, for an expiry alert
	Subject     string    // of the certificate in force
}

// Reloader holds the certificate and client CA pool in force and replaces
// them when the files change. It is safe for concurrent use.
type Reloader struct {
	files Files
	log   *slog.Logger
	cur   atomic.Pointer[state] // never nil after New

	mu       sync.Mutex // serialises reloads
	failedAt string     // fingerprint and error of the last failure, to count each failure once

	statsMu sync.Mutex
	stats   Stats
}

// state is one consistent load of the files: a handshake takes the
// certificate and the CA pool from the same state, never one of each.
type state struct {
	cert        tls.Certificate
	clientCAs   *x509.CertPool // nil without mutual TLS
	fingerprint string
}

// New loads the files and returns a Reloader serving them. The error names
// the file at fault. Nothing is watched until Watch is called. A nil log
// discards logs.
func New(f Files, log *slog.Logger) (*Reloader, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("certs: both a certificate file and a key file are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s, err := load(f)
	if err != nil {
		return nil, err
	}
	r := &Reloader{files: f, log: log.With("cert_file", f.Cert)}
	r.cur.Store(s)
	now := time.Now()
	r.stats = Stats{OK: 1, LastOK: now, LastAttempt: now,
		NotAfter: s.cert.Leaf.NotAfter, Subject: s.cert.Leaf.Subject.String()}
	r.logLoaded(s)
	return r, nil
}

// Reload re-reads the files now, by the same rules as Watch: unchanged
// content is a no-op, and a failure keeps the certificate in force and is
// returned (counted and logged once per distinct failure).
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()

	raw, err := read(r.files)
	if err != nil {
		return r.failed("", err)
	}
	fp := raw.fingerprint()
	if fp == r.cur.Load().fingerprint {
		r.recovered() // e.g. a broken write was reverted
		return nil
	}
	s, err := raw.parse(r.files, fp)
	if err != nil {
		return r.failed(fp, err)
	}
	r.cur.Store(s)
	r.recordOK(s)
	r.logLoaded(s)
	return nil
}

// Stats returns a snapshot of the reload counters.
func (r *Reloader) Stats() Stats {
	r.statsMu.Lock()
	defer r.statsMu.Unlock()
	return r.stats
}

// TLSConfig returns a server config that presents the certificate in force
// at each handshake and, with a ClientCA file, requires and verifies client
// certificates against the CA pool in force.
//
// The config resolves each handshake with GetConfigForClient, which returns
// a copy of the returned config (so fields set on it before use, such as
// NextProtos or CipherSuites, apply) filled with the current state.
// NextProtos defaults to "h2": gRPC requires ALPN, and a copy made by the
// caller, as grpc's credentials.NewTLS does, does not reach the config that
// the handshake actually uses. HTTP/1.1 clients still connect, since Go
// lets them fall back to no ALPN.
func (r *Reloader) TLSConfig() *tls.Config {
	base := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2"},
	}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		s := r.cur.Load()
		c := base.Clone()
		c.GetConfigForClient = nil
		c.GetCertificate = nil
		c.Certificates = []tls.Certificate{s.cert}
		if s.clientCAs != nil {
			c.ClientCAs = s.clientCAs
			c.ClientAuth = tls.RequireAndVerifyClientCert
		}
		return c, nil
	}
	return base
}

// ClientTLSConfig returns a client config for the identity of the files:
// each handshake presents the certificate in force and verifies the
// server's certificate, for the name dialled, against the CA bundle in
// force, which for a client is Files.ClientCA (required here): the bundle
// the server's certificate chains to. A client that keeps reconnecting,
// as an xDS subscription does, so follows a rotation of both sides.
func (r *Reloader) ClientTLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c := r.cur.Load().cert
			return &c, nil
		},
		// The standard verification reads a fixed RootCAs; VerifyConnection
		// below does the same checks against the pool in force.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			roots := r.cur.Load().clientCAs
			if roots == nil {
				return errors.New("certs: no CA bundle to verify the server with")
			}
			if len(cs.PeerCertificates) == 0 {
				return errors.New("certs: the server sent no certificate")
			}
			opts := x509.VerifyOptions{Roots: roots, DNSName: cs.ServerName, Intermediates: x509.NewCertPool()}
			for _, c := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(opts)
			return err
		},
	}
}

// rawFiles is the content of the files, read before parsing so that the
// fingerprint can tell whether anything changed.
type rawFiles struct{ cert, key, clientCA []byte }

func read(f Files) (rawFiles, error) {
	var raw rawFiles
	var err error
	if raw.cert, err = os.ReadFile(f.Cert); err != nil {
		return raw, fmt.Errorf("read certificate: %w", err)
	}
	if raw.key, err = os.ReadFile(f.Key); err != nil {
		return raw, fmt.Errorf("read key: %w", err)
	}
	if f.ClientCA != "" {
		if raw.clientCA, err = os.ReadFile(f.ClientCA); err != nil {
			return raw, fmt.Errorf("read client CA: %w", err)
		}
	}
	return raw, nil
}

// fingerprint is a hash of the three contents; lengths are included so
// that bytes moving from one file to the next change it.
func (raw rawFiles) fingerprint() string {
	h := sha256.New()
	for _, b := range [][]byte{raw.cert, raw.key, raw.clientCA} {
		_ = binary.Write(h, binary.BigEndian, uint64(len(b)))
		h.Write(b)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

func load(f Files) (*state, error) {
	raw, err := read(f)
	if err != nil {
		return nil, err
	}
	return raw.parse(f, raw.fingerprint())
}

func (raw rawFiles) parse(f Files, fingerprint string) (*state, error) {
	chain, err := parseCerts(raw.cert)
	if err != nil {
		return nil, fmt.Errorf("certificate %s: %w", f.Cert, err)
	}
	if !hasPrivateKey(raw.key) {
		return nil, fmt.Errorf("key %s: no PEM block of a private key", f.Key)
	}
	cert, err := tls.X509KeyPair(raw.cert, raw.key)
	if err != nil {
		return nil, fmt.Errorf("key %s with certificate %s: %w", f.Key, f.Cert, err)
	}
	// Set whatever the GODEBUG x509keypairleaf says: Stats and the logs
	// need the leaf, and handshakes skip a parse.
	cert.Leaf = chain[0]
	s := &state{cert: cert, fingerprint: fingerprint}
	if f.ClientCA != "" {
		cas, err := parseCerts(raw.clientCA)
		if err != nil {
			return nil, fmt.Errorf("client CA %s: %w", f.ClientCA, err)
		}
		s.clientCAs = x509.NewCertPool()
		for _, ca := range cas {
			s.clientCAs.AddCert(ca)
		}
	}
	return s, nil
}

// parseCerts parses every CERTIFICATE block of a PEM file. Unlike
// CertPool.AppendCertsFromPEM it fails on a block it cannot parse: a
// truncated bundle must not silently drop a CA.
func parseCerts(pemData []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for rest := pemData; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d of the file: %w", len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		if len(bytes.TrimSpace(pemData)) == 0 {
			return nil, errors.New("file is empty")
		}
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	return certs, nil
}

func hasPrivateKey(pemData []byte) bool {
	for rest := pemData; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return false
		}
		if strings.HasSuffix(block.Type, "PRIVATE KEY") {
			return true
		}
	}
}

func (r *Reloader) logLoaded(s *state) {
	leaf := s.cert.Leaf
	attrs := []any{"subject", leaf.Subject.String(), "serial", leaf.SerialNumber.Text(16),
		"not_after", leaf.NotAfter, "mutual_tls", s.clientCAs != nil}
	r.log.Info("TLS certificate loaded", attrs...)
	// Served anyway: refusing would not bring a valid certificate back, and
	// clients report the expiry more clearly than a closed port.
	if time.Now().After(leaf.NotAfter) {
		r.log.Warn("TLS certificate has expired", attrs...)
	}
}

func (r *Reloader) failed(fp string, err error) error {
	// A broken file stays broken until someone rewrites it; the periodic
	// check must not count and log the same failure every interval.
	key := fp + "\x00" + err.Error()
	if key == r.failedAt {
		return err
	}
	r.failedAt = key
	r.statsMu.Lock()
	r.stats.Failed++
	r.stats.LastAttempt = time.Now()
	r.stats.LastError = err.Error()
	r.statsMu.Unlock()
	r.log.Error("TLS certificate reload failed, keeping the previous certificate", "error", err)
	return err
}

func (r *Reloader) recordOK(s *state) {
	r.failedAt = ""
	now := time.Now()
	r.statsMu.Lock()
	defer r.statsMu.Unlock()
	r.stats.OK++
	r.stats.LastOK, r.stats.LastAttempt = now, now
	r.stats.LastError = ""
	r.stats.NotAfter = s.cert.Leaf.NotAfter
	r.stats.Subject = s.cert.Leaf.Subject.String()
}

func (r *Reloader) recovered() {
	r.failedAt = ""
	r.statsMu.Lock()
	defer r.statsMu.Unlock()
	r.stats.LastError = ""
}
