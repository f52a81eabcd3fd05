package ratelimit

import (
	"context"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Register serves svc as envoy.service.ratelimit.v3.RateLimitService on s.
//
// It registers its own service description instead of the generated one
// for one reason: a request that fails to decode (Envoy can forward header
// bytes that are not valid UTF-8, which proto3 strings reject) must come
// back as INVALID_ARGUMENT naming the problem, not as the INTERNAL error
// the generated handler passes through.
func Register(s grpc.ServiceRegistrar, svc rlsv3.RateLimitServiceServer) {
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: "envoy.service.ratelimit.v3.RateLimitService",
		HandlerType: (*rlsv3.RateLimitServiceServer)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "ShouldRateLimit",
			Handler:    shouldRateLimitHandler,
		}},
		Metadata: "envoy/service/ratelimit/v3/rls.proto",
	}, svc)
}

func shouldRateLimitHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(rlsv3.RateLimitRequest)
	if err := dec(in); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "malformed RateLimitRequest: %s", status.Convert(err).Message())
	}
	call := func(ctx context.Context, req any) (any, error) {
		return srv.(rlsv3.RateLimitServiceServer).ShouldRateLimit(ctx, req.(*rlsv3.RateLimitRequest))
	}
	if interceptor == nil {
		return call(ctx, in)
	}
	return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}, call)
}
