package tensorcheck

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error is what every Client method returns on failure: the gRPC status code
// and the server's message (or the client's own, for a request it refused to
// send). Use errors.As to get at it, or Code for the code alone:
//
//	var tcErr *tensorcheck.Error
//	if errors.As(err, &tcErr) && tcErr.Code == codes.FailedPrecondition { ... }
type Error struct {
	Code    codes.Code
	Message string

	// The status as received; nil for errors raised by client-side checks.
	status *status.Status
}

// Error formats the code and the message.
func (e *Error) Error() string {
	return fmt.Sprintf("tensorcheck: %s: %s", e.Code, e.Message)
}

// GRPCStatus makes status.FromError and status.Code see the original status.
func (e *Error) GRPCStatus() *status.Status {
	if e.status != nil {
		return e.status
	}
	return status.New(e.Code, e.Message)
}

// Is reports DeadlineExceeded and Canceled as context.DeadlineExceeded and
// context.Canceled, so callers can test for an expired context the same way
// whether the client or the server noticed it first.
func (e *Error) Is(target error) bool {
	switch target {
	case context.DeadlineExceeded:
		return e.Code == codes.DeadlineExceeded
	case context.Canceled:
		return e.Code == codes.Canceled
	}
	return false
}

// Code returns the status code of an error returned by this package,
// codes.OK for nil and codes.Unknown for errors of other origins.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return status.Code(err)
}

// invalidArgument is a client-side validation failure; field names the
// request field the way the server would ("weight", "tolerance.atol").
func invalidArgument(field, format string, args ...interface{}) *Error {
	return &Error{
		Code:    codes.InvalidArgument,
		Message: field + ": " + fmt.Sprintf(format, args...),
	}
}

// fromRPC wraps an error returned by a generated stub.
func fromRPC(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	return &Error{Code: st.Code(), Message: st.Message(), status: st}
}
