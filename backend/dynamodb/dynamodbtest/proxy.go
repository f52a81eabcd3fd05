package dynamodbtest

import "github.com/sluice-rl/sluice/internal/faultproxy"

// Proxy is a fault proxy (internal/faultproxy) in front of DynamoDB
// Local, addressed by URL as the SDK and --endpoint want it.
type Proxy struct{ *faultproxy.Proxy }

// NewProxy forwards every connection to target (host:port).
func NewProxy(target string) (*Proxy, error) {
	p, err := faultproxy.New(target)
	if err != nil {
		return nil, err
	}
	return &Proxy{p}, nil
}

// Endpoint is the proxy's URL, for BaseEndpoint or --endpoint.
func (p *Proxy) Endpoint() string { return "http://" + p.Addr() }
