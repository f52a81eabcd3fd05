// Command sluice is Envoy's external rate-limit service and the tools that
// go with it: `sluice serve` runs the service, `sluice check` asks a
// running service for a decision, `sluice health` probes one, and
// `sluice table` creates the DynamoDB backend's table, and `limits`,
// `entity` and `buckets` manage the records and buckets of the DynamoDB
// and Redis backends.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	// Budgets follow time zones (limits with a zone): the image has no
	// zoneinfo of its own, so the binary carries the database.
	_ "time/tzdata"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	args := os.Args[1:]
	if filepath.Base(os.Args[0]) == ratelimitName {
		// Started as envoyproxy/ratelimit (Envoy Gateway's pod): serve,
		// configured from that service's environment.
		flags, ignored, err := ratelimitArgs(os.LookupEnv)
		if err != nil {
			fmt.Fprintln(os.Stderr, "sluice (as ratelimit):", err)
			os.Exit(2)
		}
		log := slog.New(slog.NewTextHandler(os.Stderr, nil))
		for _, note := range ignored {
			name, why, _ := strings.Cut(note, ": ")
			log.Warn("envoyproxy/ratelimit setting ignored", slog.String("setting", name), slog.String("why", why))
		}
		args = append(append([]string{"serve"}, flags...), args...)
	}
	os.Exit(run(ctx, args, os.Stdout, os.Stderr))
}

// usageError marks a mistake in the command line (exit code 2).
type usageError struct{ error }

// run executes the command line args and returns the exit code: 0 ok,
// 1 failure, 2 usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCommand()
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(stderr, "sluice:", err)
		var u usageError
		if errors.As(err, &u) || strings.HasPrefix(err.Error(), "unknown command") {
			return 2
		}
		return 1
	}
	return 0
}

// usageArgs makes a positional-argument check's complaint a usage error
// (exit code 2), like a bad flag.
func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
}

// newRootCommand is the whole command tree.
func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "sluice",
		Short:         "Sluice: Envoy's external rate-limit service, with token buckets",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newServeCommand(), newCheckCommand(), newTableCommand(), newHealthCommand(),
		newLimitsCommand(), newEntityCommand(), newBucketsCommand(), newSyncCommand(), newSharesCommand(), newQuotaCommand())
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		return flagsFromEnv(cmd.Flags())
	}
	return root
}

// flagsFromEnv sets every flag not given on the command line from its
// environment variable: --grpc-addr is SLUICE_GRPC_ADDR.
func flagsFromEnv(flags *pflag.FlagSet) error {
	var errs []error
	flags.VisitAll(func(f *pflag.Flag) {
		if f.Changed || f.Name == "help" {
			return
		}
		env := envName(f.Name)
		if v, ok := os.LookupEnv(env); ok {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, usageError{fmt.Errorf("%s=%q: %w", env, v, err)})
			}
		}
	})
	return errors.Join(errs...)
}

func envName(flag string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// newLogger builds the process logger from --log-level and --log-format.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", level)}
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageError{fmt.Errorf("--log-format %q: want text or json", format)}
}
