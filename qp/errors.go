package qp

import "errors"

// Errors returned synchronously by the verbs. Completion errors are a
// Status in the WorkCompletion instead.
var (
	ErrClosed      = errors.New("qp: device closed")
	ErrQPState     = errors.New("qp: operation not allowed in the QP's state")
	ErrQueueFull   = errors.New("qp: work queue full")
	ErrInvalidWR   = errors.New("qp: invalid work request")
	ErrInvalidAttr = errors.New("qp: invalid attribute")
	ErrNotFound    = errors.New("qp: no such object")
	ErrBusy        = errors.New("qp: resource in use")
	ErrTooMany     = errors.New("qp: resource limit reached")
	ErrCQOverflow  = errors.New("qp: completion queue overflowed")
)
