package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluice-rl/sluice/certs"
	"github.com/sluice-rl/sluice/descriptors"
	"github.com/sluice-rl/sluice/descriptors/xds"
)

// ruleSource is where the rules in force come from: the rule files of
// --config-dir, or an xDS server.
type ruleSource interface {
	Current() *descriptors.Config
	Stats() descriptors.ReloadStats
}

// openRules starts the rule source o names. Without --xds-server it loads
// --config-dir (failing on rules that do not load). With it, it
// subscribes to the server and, unless --xds-start-without-rules, waits
// for the first rules; ctx ending gives up the wait.
func openRules(ctx, watchCtx context.Context, o serveOptions, log *slog.Logger) (ruleSource, error) {
	if o.xdsServer == "" {
		return descriptors.Watch(watchCtx, o.configDir, log)
	}
	if o.xdsNodeID == "" {
		return nil, usageError{fmt.Errorf("--xds-server needs --xds-node-id")}
	}
	creds, err := xdsCredentials(watchCtx, o, log)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(o.xdsServer, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, usageError{fmt.Errorf("--xds-server %q: %w", o.xdsServer, err)}
	}
	context.AfterFunc(watchCtx, func() { conn.Close() })
	src, err := xds.Subscribe(watchCtx, conn, xds.Options{NodeID: o.xdsNodeID, Log: log})
	if err != nil {
		conn.Close()
		return nil, err
	}
	if o.xdsStartWithoutRules {
		return src, nil
	}
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-src.Ready():
			return src, nil
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the first rules from the xDS server %s: %w", o.xdsServer, ctx.Err())
		case <-tick.C:
			log.Warn("waiting for the first rules from the xDS server (--xds-start-without-rules serves without them)",
				slog.String("xds_server", o.xdsServer), slog.String("last_error", src.Stats().LastError))
		}
	}
}

// xdsCredentials are the transport credentials to the xDS server. With a
// client certificate (mutual TLS, as Envoy Gateway runs it), the
// certificate, its key and the CA bundle are watched and reloaded like
// serve's own: Envoy Gateway rotates them in its Secret, and every
// reconnection shows the files in force.
func xdsCredentials(watchCtx context.Context, o serveOptions, log *slog.Logger) (credentials.TransportCredentials, error) {
	static := clientTLS{ca: o.xdsCA, cert: o.xdsCert, key: o.xdsKey,
		caFlag: "--xds-tls-ca", certFlag: "--xds-tls-cert", keyFlag: "--xds-tls-key"}
	creds, err := static.transport() // checks the flags go together
	if err != nil || o.xdsCert == "" {
		return creds, err
	}
	r, err := certs.New(certs.Files{Cert: o.xdsCert, Key: o.xdsKey, ClientCA: o.xdsCA}, log.With(slog.String("component", "xds-tls")))
	if err != nil {
		return nil, fmt.Errorf("--xds-tls-cert, --xds-tls-key, --xds-tls-ca: %w", err)
	}
	go r.Watch(watchCtx, 0)
	return credentials.NewTLS(r.ClientTLSConfig()), nil
}

// rulesFrom names where the rules come from, for the logs.
func rulesFrom(o serveOptions) string {
	if o.xdsServer != "" {
		return "xds://" + o.xdsServer
	}
	return o.configDir
}
