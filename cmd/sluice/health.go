package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

func newHealthCommand() *cobra.Command {
	var addr, path string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Probe a running Sluice's readiness (for container health checks)",
		Long: `GET http://ADDR/readyz and exit 0 when Sluice answers 200 (rules loaded, backend
answering, not shutting down), 1 otherwise. Container images without a shell
or curl use it as their health check. --http-addr is serve's flag of the same
name (so SLUICE_HTTP_ADDR serves both); a host left empty is 127.0.0.1.`,
		Example: `  sluice health
  sluice health --http-addr 127.0.0.1:9080 --path /healthz`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			url := "http://" + localAddr(addr, "127.0.0.1") + path
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return usageError{fmt.Errorf("--http-addr/--path: %w", err)}
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("%s: %w", url, err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
			}
			fmt.Fprintln(cmd.OutOrStdout(), strings.TrimSpace(string(body)))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "http-addr", ":8080", "Sluice's HTTP address, as given to serve (an empty host is 127.0.0.1)")
	f.StringVar(&path, "path", "/readyz", "what to probe: /readyz or /healthz")
	f.DurationVar(&timeout, "timeout", 2*time.Second, "deadline of the probe")
	return cmd
}

// localAddr is addr with an empty or unspecified host (":8080",
// "0.0.0.0:8080", serve's way of saying every interface) replaced by
// host, so that the tools run beside serve reach it from the same setting.
func localAddr(addr, host string) string {
	h, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr // the caller's request fails and names it
	}
	if ip := net.ParseIP(h); h == "" || (ip != nil && ip.IsUnspecified()) {
		return net.JoinHostPort(host, port)
	}
	return addr
}
