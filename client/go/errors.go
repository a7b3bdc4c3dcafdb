package tensorcheck

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// RetryPushbackKey is the trailing metadata by which a server says how long
// to wait before sending a refused request again, in decimal milliseconds
// (the key of gRPC's retry design, gRFC A6).
const RetryPushbackKey = "grpc-retry-pushback-ms"

// Error is what every Client method returns on failure: the gRPC status code
// and the server's message (or the client's own, for a request it refused to
// send). Use errors.As to get at it, or Code for the code alone:
//
//	var tcErr *tensorcheck.Error
//	if errors.As(err, &tcErr) && tcErr.Code == codes.FailedPrecondition { ... }
//
// RetryAfter is the server's retry hint (RetryPushbackKey), 0 when it sent
// none. The server sets it on transient refusals: codes.Unavailable when its
// queue is full or it is draining, codes.ResourceExhausted when its budget of
// bytes in flight is momentarily full. The Client retries those by itself
// (WithMaxRetries), so an error that reaches the caller with RetryAfter set
// was refused on every attempt. A refusal without it is permanent for that
// request (a tensor, the work or the response over a server limit).
type Error struct {
	Code       codes.Code
	Message    string
	RetryAfter time.Duration

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

// fromRPC wraps a non-nil error returned by a generated stub (or by Dial);
// trailer is the call's trailing metadata (nil when there is none), where
// the retry hint travels.
func fromRPC(err error, trailer metadata.MD) *Error {
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	return &Error{Code: st.Code(), Message: st.Message(), RetryAfter: retryAfter(trailer), status: st}
}

// retryAfter reads the retry hint: a non-negative decimal number of
// milliseconds (at most 12 digits), else 0: absent, negative or not a
// number is no hint, and the call is not retried. A hint of 0 ms ("retry at
// once") reads as 1 ms, so that RetryAfter > 0 exactly when there was one.
func retryAfter(trailer metadata.MD) time.Duration {
	v := trailer.Get(RetryPushbackKey)
	if len(v) == 0 {
		return 0
	}
	s := strings.TrimSpace(v[0])
	if s == "" || len(s) > 12 || strings.TrimLeft(s, "0123456789") != "" {
		return 0
	}
	ms, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0
	}
	if ms == 0 {
		ms = 1
	}
	return time.Duration(ms) * time.Millisecond
}

// Where a Client's server address came from, as errors that name it say.
const (
	serverGiven   = "given to Dial"
	serverFromEnv = "from TENSORCHECK_SERVER"
	serverDefault = "the default: TENSORCHECK_SERVER is unset"
)

// unreachableHow ends the message of a server that cannot be reached: how
// to point the client at another one (the Python client's words).
const unreachableHow = `. Start one there, or point the client at yours: tensorcheck.Dial(ctx, "host:port"), ` +
	`or TENSORCHECK_SERVER=host:port in the environment and Dial(ctx, "")`

// callError is err as a Client method returns it: a server that cannot be
// reached (see unreachable) is named by its address.
func (c *Client) callError(err error) error {
	if err == nil {
		return nil
	}
	e, ok := err.(*Error)
	if !ok {
		e = fromRPC(err, nil)
	}
	if e.Code != codes.Unavailable || e.RetryAfter > 0 {
		return err
	}
	return unreachable(e, c.server, c.serverFrom)
}

// unreachable rewrites e, a codes.Unavailable without the server's retry
// hint (the server's own refusals carry one: the connection failed or
// broke) or an error of Dial, to name the server's address, where it came
// from and gRPC's own message, and how to point the client elsewhere
// (TENSORCHECK_SERVER):
//
//	no answer from a tensorcheck server at localhost:50051 (the default:
//	TENSORCHECK_SERVER is unset; connection error: ...). Start one there, ...
//
// A message of the client's about what it was doing on the way (asking
// the store, uploading a tensor) is dropped: those are calls the caller
// did not make. The code and the status (its details) stay those received.
func unreachable(e *Error, server, from string) *Error {
	cause := e.Message
	if e.status != nil {
		cause = e.status.Message()
	}
	return &Error{
		Code:       e.Code,
		Message:    fmt.Sprintf("no answer from a tensorcheck server at %s (%s; %s)%s", server, from, cause, unreachableHow),
		RetryAfter: e.RetryAfter,
		status:     e.status,
	}
}

// FailError is Report.Err's error: the report of a verification whose
// verdict is not PASS. Its text is the report's (Report.String), the
// server's headline first.
type FailError struct {
	Report *Report
}

// Error is the report as Report.String prints it.
func (e *FailError) Error() string { return e.Report.String() }

// Err is nil when the verdict is PASS, else a *FailError carrying the
// report, for a test to fail with:
//
//	if err := rep.Err(); err != nil {
//		t.Fatal(err) // the server's headline first
//	}
func (r *Report) Err() error {
	if r.Passed {
		return nil
	}
	return &FailError{Report: r}
}
