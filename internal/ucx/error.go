package ucx

import (
	"errors"
	"fmt"
)

// Error is a failed UCX call: the operation, the ucs_status_t and its text
// from ucs_status_string. Every status in this package becomes one of these
// through a single conversion function.
type Error struct {
	Op     string // the UCX function, e.g. "ucp_put_nbx"
	Status int    // the ucs_status_t, negative
	Name   string // ucs_status_string(Status), e.g. "Connection reset by remote peer"
}

func (e *Error) Error() string {
	return fmt.Sprintf("ucx: %s: %s (%d)", e.Op, e.Name, e.Status)
}

// ucs_status_t values that callers and tests of this package look for.
const (
	StatusIOError         = -3  // UCS_ERR_IO_ERROR
	StatusNoMemory        = -4  // UCS_ERR_NO_MEMORY
	StatusInvalidParam    = -5  // UCS_ERR_INVALID_PARAM
	StatusUnreachable     = -6  // UCS_ERR_UNREACHABLE
	StatusInvalidAddr     = -7  // UCS_ERR_INVALID_ADDR
	StatusNotImplemented  = -8  // UCS_ERR_NOT_IMPLEMENTED
	StatusNoDevice        = -14 // UCS_ERR_NO_DEVICE
	StatusBusy            = -15 // UCS_ERR_BUSY
	StatusCanceled        = -16 // UCS_ERR_CANCELED
	StatusTimedOut        = -20 // UCS_ERR_TIMED_OUT
	StatusUnsupported     = -22 // UCS_ERR_UNSUPPORTED
	StatusNotConnected    = -24 // UCS_ERR_NOT_CONNECTED
	StatusConnectionReset = -25 // UCS_ERR_CONNECTION_RESET
	StatusEndpointTimeout = -80 // UCS_ERR_ENDPOINT_TIMEOUT
)

// IsStatus reports whether err is (or wraps) an *Error with the given
// status.
func IsStatus(err error, status int) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == status
}

// IsPeerFailure reports whether err is (or wraps) an *Error whose status
// says the peer or the link to it failed: a connection reset or refused,
// an unreachable peer, an I/O error, or a status in UCX's link-failure or
// endpoint-failure ranges (keepalive timeouts among them).
func IsPeerFailure(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	s := e.Status
	switch {
	case s == StatusConnectionReset, s == StatusUnreachable, s == StatusIOError,
		s == StatusNotConnected, s == StatusTimedOut, s == StatusCanceled:
		return true
	case s <= -40 && s >= -59: // UCS_ERR_FIRST_LINK_FAILURE .. LAST
		return true
	case s <= -60 && s >= -89: // UCS_ERR_FIRST_ENDPOINT_FAILURE .. LAST
		return true
	}
	return false
}

// ErrNotCompiled is wrapped by the error of every constructor of a build
// without the ucx tag (or without cgo).
var ErrNotCompiled = errors.New("ucx: not compiled in (build with -tags ucx and CGO_ENABLED=1; needs libucx-dev)")

// ErrClosed is wrapped by the error of an operation on a closed Context,
// Worker, Endpoint, MemHandle or RemoteKey.
var ErrClosed = errors.New("ucx: closed")
