package ratelimit

import (
	"context"
	"log/slog"
	"runtime/debug"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RecoverPanics is a unary interceptor that turns a panic in a handler into
// an INTERNAL error for that call, logged with its stack, instead of a
// crashed process: a rate limiter sits in front of every request, and one
// bad call must not take the others down with it.
func RecoverPanics(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				log.LogAttrs(ctx, slog.LevelError, "panic in gRPC handler",
					slog.String("method", info.FullMethod), panicAttr(r), slog.String("stack", string(debug.Stack())))
				resp, err = nil, status.Error(codes.Internal, "internal error")
			}
		}()
		return handler(ctx, req)
	}
}
