package main

import (
	"context"
	"errors"

	"github.com/redis/rueidis"
	"github.com/spf13/pflag"

	"github.com/sluice-rl/sluice/backend/redis"
)

// addRedisFlags defines the flags that say how to reach Redis, the same
// way for serve and for the operator commands.
func addRedisFlags(f *pflag.FlagSet, c *redis.Conn) {
	f.StringVar(&c.URL, "redis-url", "", "redis backend: redis://[user:password@]host:port[/db], rediss:// for TLS, unix:///path; more Cluster seeds as ?addr=host:port, Sentinel with ?master_set=NAME")
	f.StringVar(&c.Password, "redis-password", "", "redis backend: the password, replacing the URL's (set SLUICE_REDIS_PASSWORD rather than the flag, to keep it out of the process list)")
	f.StringVar(&c.PasswordFile, "redis-password-file", "", "redis backend: read the password (or user:password) from this file at every connection, so a rotated secret is picked up")
	f.StringVar(&c.CAFile, "redis-tls-ca", "", "redis backend: trust this CA bundle (PEM) too, beside the system's; turns TLS on")
	f.StringVar(&c.CertFile, "redis-tls-cert", "", "redis backend: client certificate (PEM) for servers that ask for one; turns TLS on")
	f.StringVar(&c.KeyFile, "redis-tls-key", "", "redis backend: the key of --redis-tls-cert (PEM)")
	f.BoolVar(&c.SkipHostnameVerification, "redis-tls-skip-hostname-verification", false, "redis backend: accept a server certificate issued for another name, still verifying its chain; turns TLS on")
}

// errRedisURL is the usage error of a Redis command without a URL.
var errRedisURL = errors.New("--redis-url (or SLUICE_REDIS_URL) is required with the redis backend: redis://host:port")

// dialRedis connects as c says; a missing URL is a usage error.
func dialRedis(ctx context.Context, c redis.Conn) (rueidis.Client, error) {
	if c.URL == "" {
		return nil, usageError{errRedisURL}
	}
	return redis.Dial(ctx, c)
}

// redisServed is the Redis backend as serve runs it: closing it closes
// the client serve dialled too.
type redisServed struct {
	*redis.Backend
	client rueidis.Client
}

func (r redisServed) Close() error {
	err := r.Backend.Close()
	r.client.Close()
	return err
}
