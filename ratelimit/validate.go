package ratelimit

import (
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// InputLimits bound what one request may carry. Envoy's own requests stay
// far below them; they exist so a broken or hostile client costs little.
// A request over one is refused with INVALID_ARGUMENT, and the message
// ends with the name of the limit it hit, e.g. "(max-descriptors)", so an
// operator knows which one to raise.
type InputLimits struct {
	MaxDescriptors int // descriptors per request
	MaxEntries     int // entries per descriptor
	MaxKeyLen      int // bytes in a domain or an entry key
	MaxValueLen    int // bytes in an entry value
}

// DefaultInputLimits returns the limits used for zero fields of Options.Input.
func DefaultInputLimits() InputLimits {
	return InputLimits{MaxDescriptors: 64, MaxEntries: 32, MaxKeyLen: 256, MaxValueLen: 4096}
}

func (l InputLimits) withDefaults() InputLimits {
	d := DefaultInputLimits()
	if l.MaxDescriptors > 0 {
		d.MaxDescriptors = l.MaxDescriptors
	}
	if l.MaxEntries > 0 {
		d.MaxEntries = l.MaxEntries
	}
	if l.MaxKeyLen > 0 {
		d.MaxKeyLen = l.MaxKeyLen
	}
	if l.MaxValueLen > 0 {
		d.MaxValueLen = l.MaxValueLen
	}
	return d
}

// The names of the limits, as messages give them.
const (
	nameMaxDescriptors = "max-descriptors"
	nameMaxEntries     = "max-entries"
	nameMaxKeyBytes    = "max-key-bytes"
	nameMaxValueBytes  = "max-value-bytes"
)

// validate returns an INVALID_ARGUMENT status naming the first problem.
func (l InputLimits) validate(req *rlsv3.RateLimitRequest) error {
	bad := func(format string, args ...any) error {
		return status.Error(codes.InvalidArgument, fmt.Sprintf(format, args...))
	}
	switch {
	case req.GetDomain() == "":
		return bad("domain is empty")
	case len(req.Domain) > l.MaxKeyLen:
		return bad("domain is %d bytes, over the limit of %d (%s)", len(req.Domain), l.MaxKeyLen, nameMaxKeyBytes)
	case len(req.Descriptors) == 0:
		return bad("request has no descriptors")
	case len(req.Descriptors) > l.MaxDescriptors:
		return bad("request has %d descriptors, over the limit of %d (%s)", len(req.Descriptors), l.MaxDescriptors, nameMaxDescriptors)
	}
	for i, d := range req.Descriptors {
		n := len(d.GetEntries())
		switch {
		case n == 0:
			return bad("descriptor %d has no entries", i)
		case n > l.MaxEntries:
			return bad("descriptor %d has %d entries, over the limit of %d (%s)", i, n, l.MaxEntries, nameMaxEntries)
		}
		for j, e := range d.Entries {
			switch {
			case e.GetKey() == "":
				return bad("descriptor %d entry %d has an empty key", i, j)
			case len(e.Key) > l.MaxKeyLen:
				return bad("descriptor %d entry %d: key is %d bytes, over the limit of %d (%s)", i, j, len(e.Key), l.MaxKeyLen, nameMaxKeyBytes)
			case len(e.GetValue()) > l.MaxValueLen:
				return bad("descriptor %d entry %d (%.64s): value is %d bytes, over the limit of %d (%s)", i, j, e.Key, len(e.Value), l.MaxValueLen, nameMaxValueBytes)
			}
		}
	}
	return nil
}
