package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
)

// ErrorKind names a backend failure without its message, which may quote
// request data: "timeout", "canceled", an AWS error code such as
// "ThrottlingException", or "error".
func ErrorKind(err error) string {
	var coded interface{ ErrorCode() string }
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &coded) && coded.ErrorCode() != "":
		return coded.ErrorCode()
	}
	return "error"
}

// errorAttrs describes a backend failure for the logs without its message.
// Messages are not safe to log: the backends quote the bucket's entity in
// theirs ("bucket \"<api key>\"/...: ..."), and AWS error messages may
// quote request data too; an entity is often a credential of the caller.
// What is kept comes from typed fields that carry no request data, and is
// what an operator needs to follow a failure up: the kind (as in the
// metrics), the AWS operation, the HTTP status and request ID that AWS
// support asks for, and a network error, which names only the addresses
// of the configured endpoint.
func errorAttrs(err error) []slog.Attr {
	attrs := []slog.Attr{slog.String("kind", ErrorKind(err))}
	var op interface {
		Service() string
		Operation() string
	}
	if errors.As(err, &op) {
		attrs = append(attrs, slog.String("operation", op.Service()+"."+op.Operation()))
	}
	var status interface{ HTTPStatusCode() int }
	if errors.As(err, &status) && status.HTTPStatusCode() != 0 {
		attrs = append(attrs, slog.Int("http_status", status.HTTPStatusCode()))
	}
	var rid interface{ ServiceRequestID() string }
	if errors.As(err, &rid) && rid.ServiceRequestID() != "" {
		attrs = append(attrs, slog.String("request_id", rid.ServiceRequestID()))
	}
	var netErr *net.OpError
	if errors.As(err, &netErr) {
		attrs = append(attrs, slog.String("network", netErr.Error()))
	}
	return attrs
}

// panicAttr describes a recovered panic value for the logs. A runtime
// error's message is written by the runtime (an index out of range, a nil
// dereference) and holds no request data; any other value, a string or an
// error some code panicked with, may quote the request, so only its type
// is logged. The stack, logged beside it, shows where.
func panicAttr(r any) slog.Attr {
	if re, ok := r.(runtime.Error); ok {
		return slog.String("panic", re.Error())
	}
	return slog.String("panic_type", fmt.Sprintf("%T", r))
}
