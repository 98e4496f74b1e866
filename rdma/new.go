package rdma

import (
	"context"
	"errors"
	"fmt"

	"github.com/goep/goep/comm"
)

// New creates g's transport, picking the implementation for all ranks
// alike: collective over g. One all-gather of the ranks' process
// identities decides: if every rank lives in this process, the in-process
// transport (NewInProcess); otherwise NewUCX, which needs the build tag ucx
// (without it the error wraps ErrUnsupported and names the tag). Every rank
// sees the same identities, so ranks never disagree on the choice. cfg is
// validated first, as by the constructors.
func New(ctx context.Context, g comm.Group, cfg Config) (Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ids, err := gatherProcesses(ctx, g)
	if err != nil {
		return nil, err
	}
	r := otherProcess(ids)
	if r < 0 {
		return newInProcess(ctx, g, cfg, ids)
	}
	t, err := NewUCX(ctx, g, cfg)
	if errors.Is(err, ErrUnsupported) {
		return nil, fmt.Errorf("rdma: New on rank %d: ranks 0 (%s) and %d (%s) are in different processes: %w",
			g.Rank(), describeProcess(ids[0]), r, describeProcess(ids[r]), err)
	}
	return t, err
}
