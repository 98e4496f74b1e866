package launcher

import (
	"context"
	"errors"

	"github.com/goep/goep/comm"
)

// WithAbort ties the group to ctx: once ctx is done (a signal cancelled
// it, as signal.NotifyContext does, or it is past its deadline) the group
// is aborted (comm.Abort): this rank's collectives in flight and to come
// fail at once, and the other ranks learn that it stopped, with ctx's
// cause, instead of waiting for it. A join still in progress fails too.
// Pass the context that a program cancels when it must stop (eprun: on
// SIGINT and SIGTERM), so that nothing in its shutdown (a Close that waits
// for its peers) waits for peers that will not come.
func WithAbort(ctx context.Context) Option {
	return func(o *options) { o.abort = ctx }
}

// abortCause is what the other ranks are told when ctx ends.
func abortCause(ctx context.Context) string {
	cause := context.Cause(ctx)
	switch {
	case cause == nil:
		return "stopped"
	case errors.Is(cause, context.DeadlineExceeded) && cause == ctx.Err():
		return "stopped: its context's deadline passed"
	case cause == context.Canceled:
		return "stopped: its context was cancelled"
	}
	return "stopped: " + cause.Error()
}

// joinUntil bounds the join (ctx) by abort too.
func joinUntil(ctx, abort context.Context) (context.Context, context.CancelFunc) {
	if abort == nil {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(abort, func() { cancel(errors.New(abortCause(abort))) })
	return ctx, func() { stop(); cancel(nil) }
}

// abortWhenDone aborts g once abort is done.
func abortWhenDone(g comm.Group, abort context.Context) {
	if abort != nil {
		context.AfterFunc(abort, func() { comm.Abort(g, abortCause(abort)) })
	}
}
