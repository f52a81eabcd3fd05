package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// Conn says how to reach Redis.
type Conn struct {
	// URL is redis://[user:password@]host:port[/db], rediss:// for TLS,
	// or unix:///path/to/socket[?db=N]. More seed nodes of a Cluster
	// follow as ?addr=host:port (a Cluster is found by asking the server),
	// and ?master_set=NAME makes the hosts Sentinels that name the
	// primary.
	URL string
	// Password, when set, replaces the URL's (so it need not sit in a
	// command line or a manifest). PasswordFile, when set, is read for
	// the password at every connection instead, so a rotated secret is
	// used from the next reconnection on; it may hold "user:password".
	Password, PasswordFile string
	// CAFile, when set, is a PEM bundle the server's certificate may also
	// chain to, beside the system's roots; CertFile and KeyFile a client
	// certificate for servers that ask for one. Any of them turns TLS on.
	CAFile, CertFile, KeyFile string
	// SkipHostnameVerification accepts a server certificate issued for
	// another name (a cluster's nodes reached by IP), still verifying its
	// chain. It turns TLS on.
	SkipHostnameVerification bool
}

// dialTimeout bounds connecting to one node. Decisions wait no longer
// than their own deadline whatever it is.
const dialTimeout = 2 * time.Second

// Dial returns a client for c. It connects before returning, so a wrong
// address, password or certificate is reported here; a server that is
// merely down is reported too (ctx bounds the wait), and the client then
// reconnects on its own once it answers.
func Dial(ctx context.Context, c Conn) (rueidis.Client, error) {
	opt, err := c.options()
	if err != nil {
		return nil, err
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("redis %s: %w", redactURL(c.URL), err)
	}
	if err := client.Do(ctx, client.B().Ping().Build()).Error(); err != nil {
		client.Close()
		return nil, fmt.Errorf("redis %s: %w", redactURL(c.URL), err)
	}
	return client, nil
}

// options turns c into rueidis's options.
func (c Conn) options() (rueidis.ClientOption, error) {
	if c.URL == "" {
		return rueidis.ClientOption{}, errors.New("redis: no URL (redis://host:port)")
	}
	opt, err := rueidis.ParseURL(c.URL)
	if err != nil {
		// url.Error repeats the URL, password and all.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return opt, fmt.Errorf("redis URL %s: %w", redactURL(c.URL), err)
	}
	if c.Password != "" && c.PasswordFile != "" {
		return opt, errors.New("redis: a password and a password file are one too many")
	}
	if c.Password != "" {
		opt.Password = c.Password
		opt.Sentinel.Password = c.Password
	}
	if c.PasswordFile != "" {
		if _, err := readPassword(c.PasswordFile, opt.Username); err != nil {
			return opt, err
		}
		user, file := opt.Username, c.PasswordFile
		opt.AuthCredentialsFn = func(rueidis.AuthCredentialsContext) (rueidis.AuthCredentials, error) {
			return readPassword(file, user)
		}
	}
	if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.SkipHostnameVerification {
		if opt.TLSConfig == nil {
			host := opt.InitAddress[0]
			if i := strings.LastIndexByte(host, ':'); i > 0 {
				host = host[:i]
			}
			opt.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: strings.Trim(host, "[]")}
		}
		if c.CAFile != "" {
			pem, err := os.ReadFile(c.CAFile)
			if err != nil {
				return opt, fmt.Errorf("redis CA: %w", err)
			}
			pool, err := x509.SystemCertPool()
			if err != nil {
				pool = x509.NewCertPool()
			}
			if !pool.AppendCertsFromPEM(pem) {
				return opt, fmt.Errorf("redis CA %s: no certificate in it", c.CAFile)
			}
			opt.TLSConfig.RootCAs = pool
		}
		if (c.CertFile == "") != (c.KeyFile == "") {
			return opt, errors.New("redis: a client certificate needs its key, and a key its certificate")
		}
		if c.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
			if err != nil {
				return opt, fmt.Errorf("redis client certificate: %w", err)
			}
			opt.TLSConfig.Certificates = []tls.Certificate{cert}
		}
		if c.SkipHostnameVerification {
			verifyChainOnly(opt.TLSConfig)
		}
	}
	if opt.Sentinel.MasterSet != "" {
		opt.Sentinel.TLSConfig = opt.TLSConfig
		opt.Sentinel.Username = opt.Username
	}
	opt.Dialer.Timeout = dialTimeout
	// Sluice does not use client-side caching (its config records have
	// their own cache): no CLIENT TRACKING, which some managed Redis
	// services refuse.
	opt.DisableCache = true
	return opt, nil
}

// redactURL is u without its password, for messages.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	return p.Redacted()
}

// readPassword reads a password file: "password", or "user:password"
// (which replaces user).
func readPassword(file, user string) (rueidis.AuthCredentials, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return rueidis.AuthCredentials{}, fmt.Errorf("redis password file: %w", err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return rueidis.AuthCredentials{}, fmt.Errorf("redis password file %s is empty", file)
	}
	if u, p, ok := strings.Cut(v, ":"); ok {
		return rueidis.AuthCredentials{Username: u, Password: p}, nil
	}
	return rueidis.AuthCredentials{Username: user, Password: v}, nil
}

// verifyChainOnly makes cfg verify the server's chain against its roots
// (the system's when none) but not the name it was issued for.
func verifyChainOnly(cfg *tls.Config) {
	cfg.InsecureSkipVerify = true // the name check only: the chain is verified below
	roots := cfg.RootCAs
	cfg.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return errors.New("redis: the server sent no certificate")
		}
		certs := make([]*x509.Certificate, len(raw))
		for i, r := range raw {
			c, err := x509.ParseCertificate(r)
			if err != nil {
				return fmt.Errorf("redis: server certificate: %w", err)
			}
			certs[i] = c
		}
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		_, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter})
		if err != nil {
			return fmt.Errorf("redis: server certificate: %w", err)
		}
		return nil
	}
}
