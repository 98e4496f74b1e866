package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/goep/goep/device"
	"github.com/goep/goep/executor"
)

// The backends a run can use (Config.Backend).
const (
	// BackendHost is the host backend (device.NewHost): runs anywhere.
	BackendHost = "host"
	// BackendCUDA is the CUDA backend (device.NewCUDA, build tag cuda):
	// each rank uses GPU GOEP_DEVICE (default 0); in-process ranks share
	// that GPU and one *device.CUDA.
	BackendCUDA = "cuda"
)

// Backends lists the values Config.Backend may take.
var Backends = []string{BackendHost, BackendCUDA}

// ErrNoCUDA is returned for the cuda backend by a binary built without
// it.
var ErrNoCUDA = errors.New("backend cuda: not compiled into this binary; build it with -tags cuda (and CGO_ENABLED=1)")

// CheckBackend says whether this binary can run backend kind: nil for
// host, ErrNoCUDA for cuda in a build without the cuda tag, an error
// naming the choices for anything else. It touches no device.
func CheckBackend(kind string) error {
	switch kind {
	case "", BackendHost:
		return nil
	case BackendCUDA:
		if !CUDACompiled {
			return ErrNoCUDA
		}
		return nil
	}
	return fmt.Errorf("backend %q: want %s", kind, strings.Join(Backends, " or "))
}

// DeviceOrdinal is the GPU this process uses: GOEP_DEVICE (which
// launcher.Bootstrap sets from the local rank), else 0. A value that is
// not a non-negative integer is an error.
func DeviceOrdinal() (int, error) {
	s, ok := os.LookupEnv("GOEP_DEVICE")
	if !ok {
		return 0, nil
	}
	d, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || d < 0 {
		return 0, fmt.Errorf("GOEP_DEVICE=%q: want a non-negative GPU index", s)
	}
	return d, nil
}

// NewBackend opens the backend of kind (Config.Backend; "" is host). For
// cuda it opens GPU DeviceOrdinal(); in a build without the cuda tag it
// returns ErrNoCUDA.
func NewBackend(kind string) (device.Backend, error) {
	if err := CheckBackend(kind); err != nil {
		return nil, err
	}
	if kind != BackendCUDA {
		return device.NewHost(), nil
	}
	ord, err := DeviceOrdinal()
	if err != nil {
		return nil, err
	}
	b, err := device.NewCUDA(ord)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// DeviceName is the GPU's name of a CUDA backend ("NVIDIA H200"), else "".
func DeviceName(b device.Backend) string {
	if n, ok := b.(interface{ Name() string }); ok {
		return n.Name()
	}
	return ""
}

// clock times one rank's iterations of work on one stream: begin after
// the barrier, end once the work is enqueued (before Synchronize), then
// elapsed after Synchronize.
type clock interface {
	begin() error
	end() error
	// elapsed is the iteration's start on the host clock (for spans) and
	// its duration.
	elapsed() (time.Time, time.Duration, error)
}

// wallClock is the host's: the time from begin to elapsed, so that it
// includes the Synchronize.
type wallClock struct{ t0 time.Time }

func (c *wallClock) begin() error { c.t0 = time.Now(); return nil }
func (c *wallClock) end() error   { return nil }
func (c *wallClock) elapsed() (time.Time, time.Duration, error) {
	return c.t0, time.Since(c.t0), nil
}

// newClock is the clock of engine e's stream: CUDA events on the cuda
// backend, the wall clock on the host.
func newClock(e *executor.Engine) (clock, error) {
	if e.Stream().Backend().Kind() == device.KindCUDA {
		return newEventClock(e)
	}
	return &wallClock{}, nil
}

// baseline runs the copy baseline on the rank's backend, once for each
// dtype the case's calls move (an fp8 case with calls that combine: its fp8
// rows with their scales, and bf16 rows), named baselineName.
func (st *rankState) baseline(ctx context.Context, e *executor.Engine) error {
	for _, dt := range st.c.callDTypes(st.cfg.Calls) {
		name := baselineName(st.c, dt)
		if err := st.begin(ctx, name); err != nil {
			return err
		}
		var err error
		if st.backend.Kind() == device.KindCUDA {
			err = st.runCUDABaseline(ctx, e, name, dt)
		} else {
			err = st.runBaseline(ctx, st.ctl, name, dt)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// baselineName names the copy baseline of rows of dtype dt in case c:
// "baseline" for the case's dtype, "baseline/bf16" for the bf16 rows of an
// fp8 case's calls that combine.
func baselineName(c Case, dt device.DType) string {
	if dt == c.DType {
		return "baseline"
	}
	return "baseline/" + dt.String()
}
