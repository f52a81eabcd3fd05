package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"

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
	creds, err := clientTLS{ca: o.xdsCA, cert: o.xdsCert, key: o.xdsKey,
		caFlag: "--xds-tls-ca", certFlag: "--xds-tls-cert", keyFlag: "--xds-tls-key"}.transport()
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

// rulesFrom names where the rules come from, for the logs.
func rulesFrom(o serveOptions) string {
	if o.xdsServer != "" {
		return "xds://" + o.xdsServer
	}
	return o.configDir
}
