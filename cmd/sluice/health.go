package main

import (
	"context"
	"fmt"
	"io"
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
or curl use it as their health check.`,
		Example: `  sluice health
  sluice health --addr 127.0.0.1:8080 --path /healthz`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			url := "http://" + addr + path
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return usageError{fmt.Errorf("--addr/--path: %w", err)}
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
	f.StringVar(&addr, "addr", "127.0.0.1:8080", "Sluice's HTTP address (--http-addr of serve)")
	f.StringVar(&path, "path", "/readyz", "what to probe: /readyz or /healthz")
	f.DurationVar(&timeout, "timeout", 2*time.Second, "deadline of the probe")
	return cmd
}
