package ratelimit

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// Register serves svc as envoy.service.ratelimit.v3.RateLimitService on s.
//
// A request that does not decode never reaches svc: gRPC answers it
// itself. Envoy can forward header bytes that are not valid UTF-8, which
// proto3 strings reject, so such a request fails with INTERNAL and the
// message "string field contains invalid UTF-8"; Envoy then applies its
// failure_mode_deny.
func Register(s grpc.ServiceRegistrar, svc rlsv3.RateLimitServiceServer) {
	rlsv3.RegisterRateLimitServiceServer(s, svc)
}
