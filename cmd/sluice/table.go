package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/logging"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	sluiceddb "github.com/sluice-rl/sluice/backend/dynamodb"
)

// tableOptions are the flags of `sluice table create`; serve's DynamoDB
// flags have the same names.
type tableOptions struct {
	table, region, endpoint string
}

func newTableCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "table",
		Short:   "Manage the DynamoDB table of the dynamodb backend",
		Example: `  sluice table create --table sluice --region eu-west-1`,
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newTableCreateCommand())
	return cmd
}

func newTableCreateCommand() *cobra.Command {
	var o tableOptions
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create the DynamoDB table (idempotent)",
		Long: `Create the table Sluice keeps buckets and configs in: PK and SK string keys,
global secondary indexes GSI1 and GSI2, on-demand billing, and DynamoDB TTL
on the attribute ttl. Waits until the table is ACTIVE. A table that already
exists with this layout is kept (TTL is still ensured); one with another
layout is an error. AWS credentials and region come from the usual AWS
chain (environment, shared config, instance role); --region overrides the
region and --endpoint points at another endpoint, such as DynamoDB Local.
Every flag can also be set by an environment variable: --table is
SLUICE_TABLE.`,
		Example: `  sluice table create --table sluice --region eu-west-1

  # DynamoDB Local (it accepts any credentials)
  AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local \
    sluice table create --table sluice --region us-east-1 --endpoint http://localhost:8000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.table == "" {
				return usageError{errors.New("--table (or SLUICE_TABLE) is required")}
			}
			client, err := newDynamoDBClient(cmd.Context(), o.region, o.endpoint, nil)
			if err != nil {
				return err
			}
			created, err := sluiceddb.CreateTable(cmd.Context(), client, o.table)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if created {
				fmt.Fprintf(out, "created table %s\n", o.table)
			} else {
				fmt.Fprintf(out, "table %s already exists\n", o.table)
			}
			fmt.Fprintln(out, "TTL is enabled on attribute ttl")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.table, "table", "", "DynamoDB table name (required)")
	addDynamoDBFlags(f, &o.region, &o.endpoint)
	return cmd
}

// addDynamoDBFlags defines --region and --endpoint the same way for every
// command that talks to DynamoDB.
func addDynamoDBFlags(f *pflag.FlagSet, region, endpoint *string) {
	f.StringVar(region, "region", "", "AWS region (default: from the AWS environment and config)")
	f.StringVar(endpoint, "endpoint", "", "DynamoDB endpoint URL, e.g. http://localhost:8000 for DynamoDB Local (default: AWS's)")
}

// newDynamoDBClient builds a DynamoDB client from the default AWS
// credential chain and region; region, when set, overrides the region and
// endpoint, when set, replaces AWS's endpoint (DynamoDB Local). A bad
// endpoint or no region at all is a usage error. log, when set, takes the
// SDK's own messages (sdkLogger); nil leaves them on stderr, as suits the
// admin commands.
func newDynamoDBClient(ctx context.Context, region, endpoint string, log *slog.Logger) (*dynamodb.Client, error) {
	if endpoint != "" {
		u, err := url.Parse(endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, usageError{fmt.Errorf("--endpoint %q: want a URL such as http://localhost:8000", endpoint)}
		}
	}
	var opts []func(*config.LoadOptions) error
	if log != nil {
		opts = append(opts, config.WithLogger(sdkLogger(log)))
	}
	if region != "" {
		opts = append(opts, config.WithRegion(region))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("load AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, usageError{errors.New("no AWS region: set --region (SLUICE_REGION) or AWS_REGION")}
	}
	return dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
			// DynamoDB Local (and other emulators) send no x-amz-crc32
			// header on error responses, and the SDK then logs "failed to
			// close HTTP response body" for every one of them, such as a
			// failed condition (aws/aws-sdk-go-v2#3545).
			o.DisableValidateResponseChecksum = true
		}
	}), nil
}

// sdkLogger sends the AWS SDK's own messages (a response body it could
// not close, say) through serve's logger, so that a JSON log stays JSON
// rather than gaining the SDK's plain lines on stderr. The SDK classifies
// them as warnings or debug output; slog's level filter applies as usual.
func sdkLogger(log *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(c logging.Classification, format string, v ...any) {
		level := slog.LevelDebug
		if c == logging.Warn {
			level = slog.LevelWarn
		}
		log.LogAttrs(context.Background(), level, fmt.Sprintf(format, v...), slog.String("component", "aws-sdk"))
	})
}
