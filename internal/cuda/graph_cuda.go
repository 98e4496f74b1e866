//go:build cuda && cgo

package cuda

/*
#include <cuda.h>
*/
import "C"

import "fmt"

// Graph is an instantiated CUDA graph (CUgraphExec) captured from a stream.
type Graph struct {
	d    *Device
	g    C.CUgraph
	exec C.CUgraphExec
}

// BeginCapture starts capturing the work enqueued on s into a graph
// (cuStreamBeginCapture, relaxed mode: goep's driver calls come from
// whichever thread holds the device (Device.Do), and stream-ordered
// allocations are captured as graph memory nodes). Work enqueued until EndCapture is recorded, not run.
func (s *Stream) BeginCapture() error {
	return s.do(func(cs C.CUstream) error {
		return result("cuStreamBeginCapture", C.cuStreamBeginCapture(cs, C.CU_STREAM_CAPTURE_MODE_RELAXED))
	})
}

// EndCapture ends the capture started by BeginCapture and instantiates the
// graph (cuStreamEndCapture, cuGraphInstantiate).
func (s *Stream) EndCapture() (*Graph, error) {
	g := &Graph{d: s.d}
	err := s.do(func(cs C.CUstream) error {
		if err := result("cuStreamEndCapture", C.cuStreamEndCapture(cs, &g.g)); err != nil {
			return err
		}
		if err := result("cuGraphInstantiate", C.cuGraphInstantiateWithFlags(&g.exec, g.g, 0)); err != nil {
			C.cuGraphDestroy(g.g)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: end capture: %w", err)
	}
	return g, nil
}

// Launch enqueues the graph's work on s (cuGraphLaunch).
func (g *Graph) Launch(s *Stream) error {
	err := s.do(func(cs C.CUstream) error {
		return result("cuGraphLaunch", C.cuGraphLaunch(g.exec, cs))
	})
	if err == nil {
		counts.graphLaunches.Add(1)
	}
	return err
}

// Close destroys the graph; launches of it must have completed.
func (g *Graph) Close() error {
	return g.d.Do(func() error {
		if g.exec == nil {
			return nil
		}
		err := result("cuGraphExecDestroy", C.cuGraphExecDestroy(g.exec))
		if e2 := result("cuGraphDestroy", C.cuGraphDestroy(g.g)); err == nil {
			err = e2
		}
		g.exec, g.g = nil, nil
		return err
	})
}
