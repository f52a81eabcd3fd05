package main

import (
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ratelimitName is the name Envoy Gateway starts its rate-limit image
// with (/bin/ratelimit). Run under it, Sluice is `sluice serve` configured
// from envoyproxy/ratelimit's environment variables, so the pod Envoy
// Gateway deploys works with Sluice's image in place of that service's.
const ratelimitName = "ratelimit"

// ignoredVar is one of envoyproxy/ratelimit's settings that Sluice does
// not honour: why, and which values make a difference (nil: any).
type ignoredVar struct {
	why     string
	matters func(value string) bool
}

func isTrue(v string) bool  { b, err := strconv.ParseBool(v); return err == nil && b }
func isFalse(v string) bool { b, err := strconv.ParseBool(v); return err == nil && !b }

// ratelimitIgnored lists envoyproxy/ratelimit's settings that Sluice
// cannot honour, each with why: set to a value that matters, they are
// named at start.
func ratelimitIgnored() map[string]ignoredVar {
	// Tuning of envoyproxy/ratelimit's Redis pool, which rueidis does
	// not need: it pipelines every call on one connection per node.
	inert := ignoredVar{"the Redis client pipelines every call on one connection per node and reconnects on its own: nothing to tune", func(string) bool { return false }}
	vars := map[string]ignoredVar{
		"USE_STATSD":                     {"Sluice sends no statsd; USE_PROMETHEUS=true serves the same names on PROMETHEUS_ADDR", isTrue},
		"PROMETHEUS_PATH":                {"metrics are on /metrics", func(v string) bool { return v != "/metrics" }},
		"PROMETHEUS_MAPPER_YAML":         {"Sluice names its ratelimit_service_* counters as Envoy Gateway's mapping does and applies no other", nil},
		"REDIS_PERSECOND":                {"one Redis holds every bucket, per-second limits too", isTrue},
		"REDIS_AWS_IAM_AUTH":             {"no IAM authentication: give a password (REDIS_AUTH or REDIS_AUTH_FILE)", isTrue},
		"REDIS_SENTINEL_AUTH":            {"the Sentinels are sent REDIS_AUTH's password", nil},
		"CACHE_KEY_PREFIX":               {"Sluice's keys are its own; SLUICE_KEY_PREFIX sets their first segment", nil},
		"MEMCACHE_HOST_PORT":             {"no memcache: buckets are in Redis with REDIS_URL, else in memory (or SLUICE_BACKEND's)", nil},
		"BACKEND_TYPE":                   {"no memcache: buckets are in Redis with REDIS_URL, else in memory (or SLUICE_BACKEND's)", func(v string) bool { return !strings.EqualFold(v, "redis") }},
		"RUNTIME_IGNOREDOTFILES":         {"rule files whose names start with '.' are always skipped", isFalse},
		"RUNTIME_WATCH_ROOT":             {"the rules directory itself is watched", isTrue},
		"LOCAL_CACHE_SIZE_IN_BYTES":      {"over-limit answers are cached by the backend's own rules", nil},
		"NEAR_LIMIT_RATIO":               {"use SLUICE_NEAR_LIMIT_RATIO", nil},
		"EXPIRATION_JITTER_MAX_SECONDS":  {"buckets expire by their TTL rules", nil},
		"MERGE_DOMAIN_CONFIG":            {"a domain may be defined by one rule set only", isTrue},
		"TRACING_ENABLED":                {"use SLUICE_OTLP_ENDPOINT", isTrue},
		"LIMIT_RESPONSE_HEADERS_ENABLED": {"use SLUICE_RESPONSE_HEADERS", isTrue},
	}
	for _, name := range []string{"REDIS_POOL_SIZE", "REDIS_PIPELINE_WINDOW", "REDIS_PIPELINE_LIMIT", "REDIS_CLUSTER_PIPELINE_PARALLELISM",
		"REDIS_POOL_ON_EMPTY_BEHAVIOR", "REDIS_TIMEOUT", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR",
		"REDIS_STARTUP_INITIAL_INTERVAL", "REDIS_STARTUP_MAX_INTERVAL", "REDIS_STARTUP_MAX_ELAPSED_TIME"} {
		vars[name] = inert
	}
	return vars
}

// ratelimitArgs turns envoyproxy/ratelimit's environment (lookup) into
// `sluice serve` flags, and lists the variables set that it ignored, each
// with why. The defaults are that service's: gRPC on 0.0.0.0:8081, HTTP
// (health checks and metrics) on 0.0.0.0:8080, debug on 0.0.0.0:6070,
// rules from RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config.
func ratelimitArgs(lookup func(string) (string, bool)) (args, ignored []string, err error) {
	get := func(name, def string) string {
		if v, ok := lookup(name); ok && v != "" {
			return v
		}
		return def
	}
	on := func(name string) (bool, error) {
		v, ok := lookup(name)
		if !ok || v == "" {
			return false, nil
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return false, fmt.Errorf("%s=%q: want true or false", name, v)
		}
		return b, nil
	}
	addr := func(host, port, defPort string) string {
		return net.JoinHostPort(get(host, "0.0.0.0"), get(port, defPort))
	}
	args = append(args,
		"--grpc-addr", addr("GRPC_HOST", "GRPC_PORT", "8081"),
		"--http-addr", addr("HOST", "PORT", "8080"),
		"--debug-addr", addr("DEBUG_HOST", "DEBUG_PORT", "6070"))
	if v, ok := lookup("LOG_LEVEL"); ok && v != "" {
		lv := strings.ToLower(v)
		switch lv {
		case "warning":
			lv = "warn"
		case "trace":
			lv = "debug"
		case "fatal", "panic":
			lv = "error"
		}
		args = append(args, "--log-level", lv)
	}
	if v, ok := lookup("LOG_FORMAT"); ok && v != "" {
		args = append(args, "--log-format", strings.ToLower(v))
	}
	flags := []struct {
		env, flag string
	}{{"SHADOW_MODE", "--shadow-mode"}, {"QUOTA_MODE", "--quota-mode"}, {"RESPONSE_DYNAMIC_METADATA", "--response-dynamic-metadata"}}
	for _, f := range flags {
		b, err := on(f.env)
		if err != nil {
			return nil, nil, err
		}
		if b {
			args = append(args, f.flag)
		}
	}
	switch t := get("CONFIG_TYPE", "FILE"); strings.ToUpper(t) {
	case "FILE":
		args = append(args, "--config-dir", filepath.Join(get("RUNTIME_ROOT", "/srv/runtime_data/current"), get("RUNTIME_SUBDIRECTORY", ""), "config"))
	case "GRPC_XDS_SOTW":
		args = append(args, "--xds-server", get("CONFIG_GRPC_XDS_SERVER_URL", ""), "--xds-node-id", get("CONFIG_GRPC_XDS_NODE_ID", ""))
		tlsOn, err := on("CONFIG_GRPC_XDS_SERVER_USE_TLS")
		if err != nil {
			return nil, nil, err
		}
		if tlsOn {
			args = append(args, "--xds-tls-ca", get("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ""))
			if cert := get("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", ""); cert != "" {
				args = append(args, "--xds-tls-cert", cert, "--xds-tls-key", get("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", ""))
			}
		}
		force, err := on("FORCE_START_WITHOUT_INITIAL_CONFIG")
		if err != nil {
			return nil, nil, err
		}
		if force {
			args = append(args, "--xds-start-without-rules")
		}
	default:
		return nil, nil, fmt.Errorf("CONFIG_TYPE=%q: want FILE or GRPC_XDS_SOTW", t)
	}
	tlsOn, err := on("GRPC_SERVER_USE_TLS")
	if err != nil {
		return nil, nil, err
	}
	if tlsOn {
		args = append(args, "--tls-cert", get("GRPC_SERVER_TLS_CERT", ""), "--tls-key", get("GRPC_SERVER_TLS_KEY", ""))
		if ca := get("GRPC_SERVER_TLS_CA_CERT", ""); ca != "" {
			args = append(args, "--tls-client-ca", ca)
		}
	}
	prom, err := on("USE_PROMETHEUS")
	if err != nil {
		return nil, nil, err
	}
	if prom {
		// envoyproxy/ratelimit serves its statsd names, mapped, on a
		// listener of their own; Envoy Gateway scrapes that port.
		args = append(args, "--metrics-addr", get("PROMETHEUS_ADDR", ":9090"), "--ratelimit-metrics")
	}
	redisArgs, err := ratelimitRedis(lookup)
	if err != nil {
		return nil, nil, err
	}
	args = append(args, redisArgs...)
	if b, ok := lookup("SLUICE_BACKEND"); ok && b != "" {
		for _, name := range []string{"REDIS_URL", "REDIS_AUTH", "REDIS_AUTH_FILE", "REDIS_TLS"} {
			if v, ok := lookup(name); ok && v != "" {
				ignored = append(ignored, name+": SLUICE_BACKEND="+b+" chooses the backend")
			}
		}
	}
	for name, iv := range ratelimitIgnored() {
		if v, ok := lookup(name); ok && v != "" && (iv.matters == nil || iv.matters(v)) {
			ignored = append(ignored, name+": "+iv.why)
		}
	}
	slices.Sort(ignored)
	return args, ignored, nil
}

// ratelimitRedis turns envoyproxy/ratelimit's Redis settings into the
// flags of the redis backend: REDIS_URL (host:port, or a socket path with
// REDIS_SOCKET_TYPE=unix, its default; a comma-separated list of nodes
// for REDIS_TYPE=CLUSTER, of the primary's name then Sentinels for
// SENTINEL), REDIS_AUTH or REDIS_AUTH_FILE ("password" or
// "user:password"), REDIS_TLS and its certificate files. Without
// REDIS_URL, or with SLUICE_BACKEND set, it gives none.
func ratelimitRedis(lookup func(string) (string, bool)) ([]string, error) {
	get := func(name string) string { v, _ := lookup(name); return v }
	url := strings.TrimSpace(get("REDIS_URL"))
	if b, _ := lookup("SLUICE_BACKEND"); b != "" || url == "" || strings.EqualFold(get("BACKEND_TYPE"), "memcache") {
		return nil, nil
	}
	tlsOn := false
	if v := get("REDIS_TLS"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("REDIS_TLS=%q: want true or false", v)
		}
		tlsOn = b
	}
	scheme := "redis://"
	if tlsOn {
		scheme = "rediss://"
	}
	auth, authFile := get("REDIS_AUTH"), get("REDIS_AUTH_FILE")
	if auth != "" && authFile != "" {
		return nil, errors.New("REDIS_AUTH and REDIS_AUTH_FILE: set one")
	}
	user, password, hasUser := strings.Cut(auth, ":")
	if !hasUser {
		user, password = "", auth
	}
	userinfo := ""
	if user != "" {
		userinfo = neturl.User(user).String() + "@"
	}
	var u string
	switch t := strings.ToUpper(get("REDIS_TYPE")); t {
	case "", "SINGLE":
		switch socket := strings.ToLower(get("REDIS_SOCKET_TYPE")); {
		case strings.Contains(url, "://"):
			u = url
			if tlsOn && strings.HasPrefix(u, "redis://") {
				u = "rediss://" + strings.TrimPrefix(u, "redis://")
			}
		case socket == "" || socket == "unix":
			u = "unix://" + userinfo + url
		case socket == "tcp":
			u = scheme + userinfo + url
		default:
			return nil, fmt.Errorf("REDIS_SOCKET_TYPE=%q: want tcp or unix", socket)
		}
	case "CLUSTER", "SENTINEL":
		nodes := strings.Split(url, ",")
		q := neturl.Values{}
		if t == "SENTINEL" {
			if len(nodes) < 2 {
				return nil, fmt.Errorf("REDIS_TYPE=SENTINEL: REDIS_URL=%q: want the primary's name, then the Sentinels: mymaster,host:26379,...", url)
			}
			q.Set("master_set", strings.TrimSpace(nodes[0]))
			nodes = nodes[1:]
		}
		for _, n := range nodes[1:] {
			q.Add("addr", strings.TrimSpace(n))
		}
		u = scheme + userinfo + strings.TrimSpace(nodes[0]) + "?" + q.Encode()
	default:
		return nil, fmt.Errorf("REDIS_TYPE=%q: want SINGLE, CLUSTER or SENTINEL", t)
	}
	args := []string{"--backend", "redis", "--redis-url", u}
	if password != "" {
		args = append(args, "--redis-password", password)
	}
	if authFile != "" {
		args = append(args, "--redis-password-file", authFile)
	}
	for _, f := range []struct{ env, flag string }{
		{"REDIS_TLS_CACERT", "--redis-tls-ca"}, {"REDIS_TLS_CLIENT_CERT", "--redis-tls-cert"}, {"REDIS_TLS_CLIENT_KEY", "--redis-tls-key"},
	} {
		if v := get(f.env); v != "" && tlsOn {
			args = append(args, f.flag, v)
		}
	}
	if v := get("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"); tlsOn && isTrue(v) {
		args = append(args, "--redis-tls-skip-hostname-verification")
	}
	return args, nil
}
