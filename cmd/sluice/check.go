package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

type checkOptions struct {
	addr        string
	domain      string
	descriptors []string
	hits        uint32
	charge      bool
	timeout     time.Duration
	// tls: the CA that signed Sluice's certificate, and the client
	// identity for mutual TLS.
	tls clientTLS
}

func newCheckCommand() *cobra.Command {
	var o checkOptions
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Ask a running Sluice for a decision, as Envoy would",
		Long: `Send one ShouldRateLimit request and print the decision: the overall code,
then for each descriptor its code, the limit that bound it, the whole tokens
remaining and the seconds until it resets. Each --descriptor is one
descriptor, its entries written key=value and separated by commas.
A check that consumes (--hits 1, the default) counts like real traffic.
With --charge the hits go in each descriptor's own hits_addend, as a gateway
sends the tokens a response used when it ends: by default such a charge lands
even beyond what is left, into debt (rules with charges: never excepted).`,
		Example: `  sluice check --domain edge --descriptor remote_address=10.0.0.1
  sluice check --grpc-addr sluice:8081 --domain api --descriptor api_key=k1,path=/v1/chat --hits 250
  sluice check --domain api --descriptor api_key=k9,route=chat --hits 50000 --charge`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := o.request()
			if err != nil {
				return usageError{err}
			}
			creds, err := o.transport()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			resp, err := callShouldRateLimit(ctx, localAddr(o.addr, "localhost"), creds, req)
			if err != nil {
				return err
			}
			printDecision(cmd.OutOrStdout(), req, resp)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.addr, "grpc-addr", ":8081", "Sluice's gRPC address, as given to serve (an empty host is localhost)")
	f.StringVar(&o.domain, "domain", "", "rate-limit domain (required)")
	f.StringArrayVar(&o.descriptors, "descriptor", nil, "a descriptor as key=value[,key=value...]; repeat for several")
	f.Uint32Var(&o.hits, "hits", 1, "hits_addend of the request; 0 asks without consuming")
	f.BoolVar(&o.charge, "charge", false, "send --hits as each descriptor's own hits_addend: a charge of tokens already used, as gateways send at stream end")
	f.DurationVar(&o.timeout, "timeout", 2*time.Second, "deadline of the call")
	o.tls.addFlags(f)
	return cmd
}

// transport is plaintext, or TLS when --tls-ca is given.
func (o checkOptions) transport() (credentials.TransportCredentials, error) {
	return o.tls.transport()
}

// addFlags defines --tls-ca, --tls-client-cert and --tls-client-key,
// the TLS of a command that calls a running Sluice, into c.
func (c *clientTLS) addFlags(f *pflag.FlagSet) {
	c.caFlag, c.certFlag, c.keyFlag = "--tls-ca", "--tls-client-cert", "--tls-client-key"
	f.StringVar(&c.ca, "tls-ca", "", "connect with TLS, trusting this CA bundle (PEM)")
	f.StringVar(&c.cert, "tls-client-cert", "", "client certificate (PEM) for mutual TLS; needs --tls-ca")
	f.StringVar(&c.key, "tls-client-key", "", "key of --tls-client-cert (PEM)")
}

// clientTLS is the TLS a client of Sluice's commands connects with: a CA
// bundle to trust and, for mutual TLS, a certificate and its key, each
// named by its flag in errors.
type clientTLS struct {
	ca, cert, key             string
	caFlag, certFlag, keyFlag string
}

// transport is plaintext without a CA, TLS with one.
func (c clientTLS) transport() (credentials.TransportCredentials, error) {
	if c.ca == "" {
		if c.cert != "" || c.key != "" {
			return nil, usageError{fmt.Errorf("%s and %s need %s", c.certFlag, c.keyFlag, c.caFlag)}
		}
		return insecure.NewCredentials(), nil
	}
	if (c.cert == "") != (c.key == "") {
		return nil, usageError{fmt.Errorf("%s and %s go together", c.certFlag, c.keyFlag)}
	}
	pemData, err := os.ReadFile(c.ca)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.caFlag, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, fmt.Errorf("%s %s: no PEM certificate in it", c.caFlag, c.ca)
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if c.cert != "" {
		cert, err := tls.LoadX509KeyPair(c.cert, c.key)
		if err != nil {
			return nil, fmt.Errorf("%s/%s: %w", c.certFlag, c.keyFlag, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(cfg), nil
}

func (o checkOptions) request() (*rlsv3.RateLimitRequest, error) {
	if o.domain == "" {
		return nil, fmt.Errorf("--domain is required")
	}
	if len(o.descriptors) == 0 {
		return nil, fmt.Errorf("give at least one --descriptor key=value")
	}
	req := &rlsv3.RateLimitRequest{Domain: o.domain}
	if !o.charge {
		req.HitsAddend = o.hits
	}
	for _, text := range o.descriptors {
		d := &rlv3.RateLimitDescriptor{}
		for _, pair := range strings.Split(text, ",") {
			k, v, ok := strings.Cut(pair, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("--descriptor %q: want key=value[,key=value...]", text)
			}
			d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		if o.hits == 0 || o.charge {
			// A request-level zero means one: a check asks per
			// descriptor, as a charge does.
			d.HitsAddend = wrapperspb.UInt64(uint64(o.hits))
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req, nil
}

func callShouldRateLimit(ctx context.Context, addr string, creds credentials.TransportCredentials, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", addr, err)
	}
	defer conn.Close()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("ShouldRateLimit on %s: %w", addr, err)
	}
	return resp, nil
}

func printDecision(w io.Writer, req *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse) {
	fmt.Fprintf(w, "%s (domain %s)\n", resp.GetOverallCode(), req.GetDomain())
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DESCRIPTOR\tCODE\tLIMIT\tREMAINING\tRESET")
	for i, st := range resp.GetStatuses() {
		var entries []string
		if i < len(req.Descriptors) {
			for _, e := range req.Descriptors[i].Entries {
				entries = append(entries, e.Key+"="+e.Value)
			}
		}
		limit, remaining, reset := "-", "-", "-"
		if l := st.GetCurrentLimit(); l != nil {
			limit = fmt.Sprintf("%d/%s", l.RequestsPerUnit, strings.ToLower(l.Unit.String()))
			if l.Name != "" {
				limit += " (" + l.Name + ")"
			}
			remaining = fmt.Sprint(st.LimitRemaining)
			reset = fmt.Sprintf("%ds", st.GetDurationUntilReset().GetSeconds())
		} else if st.LimitRemaining == 1<<32-1 {
			limit = "unlimited"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", strings.Join(entries, ","), st.GetCode(), limit, remaining, reset)
	}
	tw.Flush()
	for _, h := range resp.GetResponseHeadersToAdd() {
		fmt.Fprintf(w, "%s: %s\n", h.Key, h.Value)
	}
}
