package rail

import (
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/internal/view"
)

// DispatchFill is a dispatch's round payload: for each other domain n, the
// rows (rb bytes each, of x's bytes xs) and, when weighted, the TopK
// weights (of ws) of this rank's tokens that reach n.
func DispatchFill(lay *plan.Layout, xs []byte, ws []float32, weighted bool, rb int) Fill {
	K, D := lay.TopK, lay.RanksPerDomain
	return func(n int, area, rows []byte) (int, int, int) {
		toks := lay.DomainTokens(nil, n, D)
		a := view.Float32s(area)
		for i, t := range toks {
			copy(rows[i*rb:(i+1)*rb], xs[int(t)*rb:])
			if weighted {
				copy(a[i*K:(i+1)*K], ws[int(t)*K:])
			}
		}
		ab := 0
		if weighted {
			ab = len(toks) * K * 4
		}
		return len(toks), ab, len(toks) * rb
	}
}

// PartialsFill is a combine's round payload when the partials were
// computed elsewhere and downloaded (the GPU's host-staged rail): for each
// other domain n, the partials of the counts[n] tokens its rail peer
// forwarded here (rows n*maxT.. of ps, rb bytes each) and, when pws is not
// nil, their weight gradients (K fp32 each).
func PartialsFill(counts []int, ps, pws []byte, maxT, K, rb int) Fill {
	return func(n int, area, rows []byte) (int, int, int) {
		cnt := counts[n]
		copy(rows[:cnt*rb], ps[n*maxT*rb:])
		ab := 0
		if pws != nil {
			ab = copy(area[:cnt*K*4], pws[n*maxT*K*4:])
		}
		return cnt, ab, cnt * rb
	}
}
