package host

import (
	"github.com/goep/goep/device"
	"github.com/goep/goep/executor/internal/datapath"
	"github.com/goep/goep/executor/internal/plan"
	"github.com/goep/goep/internal/view"
	"github.com/goep/goep/permute"
)

// unpermuteSpec, when not nil, makes the combine sum unpermute each
// destination's row first (the fused UnpermuteCombine): peers' buffer 0 is
// then y and buffer 1 the optional weights.
type unpermuteSpec struct{ weighted bool }

// termer collects the terms of one token's sum, with scratch for the
// unpermuted rows of the fused call; one per worker goroutine.
type termer struct {
	env   *datapath.Env
	lay   *plan.Layout
	peers [][][]byte
	dt    device.DType
	u     *unpermuteSpec
	rb    int
	rows  [][]byte
	tmp   [][]byte // unpermuted rows (fused only)
	slots permute.Terms
	tw    []float32
	tpos  []int32
	// A token's slot rows, their weights and the end of each
	// destination's group among them (groups).
	grows [][]byte
	gc    []float32
	gends []int
}

func newTermer(env *datapath.Env, lay *plan.Layout, peers [][][]byte, dt device.DType, u *unpermuteSpec) *termer {
	c := &termer{env: env, lay: lay, peers: peers, dt: dt, u: u, rb: env.Hidden * dt.Size()}
	if u != nil {
		c.tw = make([]float32, lay.TopK)
		c.tpos = make([]int32, lay.TopK)
	}
	return c
}

// collect returns the terms of token t of side from its destinations in
// domain n (every destination when n < 0), in ascending rank order,
// skipping rows dropped at their destination (capacity mode). The rows stay
// valid until the next collect.
func (c *termer) collect(side *plan.SendSide, t, n int) [][]byte {
	lay, rb, D := c.lay, c.rb, c.lay.RanksPerDomain
	c.rows = c.rows[:0]
	for j := side.SendOffsets[t]; j < side.SendOffsets[t+1]; j++ {
		d, row := int(side.SendDest[j]), int(side.SendRow[j])
		if (n >= 0 && d/D != n) || row >= c.env.ValidRecv(lay, d) {
			continue
		}
		peer := c.peers[d%D]
		if c.u == nil {
			c.rows = append(c.rows, peer[0][row*rb:(row+1)*rb])
			continue
		}
		if len(c.tmp) <= len(c.rows) {
			c.tmp = append(c.tmp, make([]byte, rb))
		}
		term := c.tmp[len(c.rows)]
		slotsOn(lay, side, t, d, row, peer, c.u.weighted, c.tpos, c.tw)
		var ws []float32
		if c.u.weighted {
			ws = c.tw
		}
		permute.UnpermuteRow(c.dt, term, peer[0], c.tpos, ws, plan.PermCap(lay, c.env.P, d), &c.slots)
		c.rows = append(c.rows, term)
	}
	return c.rows
}

// groups returns, for the fused UnpermuteCombine, the permuted rows of
// token t of side's slots on each of its destinations in domain n (every
// destination when n < 0) in ascending rank order, each destination's in
// slot order, their weights (nil unweighted) and the end of each
// destination's group: the terms of permute.SumGroups, which sums them as
// collect's unpermuted rows would be summed, without writing those rows.
// Destinations and rows skipped are collect's. The slices stay valid
// until the next call.
func (c *termer) groups(side *plan.SendSide, t, n int) (rows [][]byte, w []float32, ends []int) {
	lay, rb, D := c.lay, c.rb, c.lay.RanksPerDomain
	c.grows, c.gc, c.gends = c.grows[:0], c.gc[:0], c.gends[:0]
	for j := side.SendOffsets[t]; j < side.SendOffsets[t+1]; j++ {
		d, row := int(side.SendDest[j]), int(side.SendRow[j])
		if (n >= 0 && d/D != n) || row >= c.env.ValidRecv(lay, d) {
			continue
		}
		peer := c.peers[d%D]
		slotsOn(lay, side, t, d, row, peer, c.u.weighted, c.tpos, c.tw)
		y, pcap := peer[0], plan.PermCap(lay, c.env.P, d)
		for k, p := range c.tpos {
			if p < 0 || int(p) >= pcap {
				continue
			}
			c.grows = append(c.grows, y[int(p)*rb:(int(p)+1)*rb])
			if c.u.weighted {
				c.gc = append(c.gc, c.tw[k])
			}
		}
		c.gends = append(c.gends, len(c.grows))
	}
	if !c.u.weighted {
		return c.grows, nil, c.gends
	}
	return c.grows, c.gc, c.gends
}

// slotsOn fills pos[k] with the position on rank d of slot k of token t of
// side (-1 for slots on other ranks) and, if weighted, w[k] with d's
// RecvWeights[row][k] (peer buffer 1).
func slotsOn(lay *plan.Layout, side *plan.SendSide, t, d, row int, peer [][]byte, weighted bool, pos []int32, w []float32) {
	K, L := lay.TopK, lay.NumLocalExperts
	var pw []float32
	if weighted {
		pw = view.Float32s(peer[1])
	}
	for k := range K {
		pos[k] = -1
		if side.SlotRow[t*K+k] < 0 {
			continue
		}
		if int(side.SlotExpert[t*K+k])/L == d {
			pos[k] = side.SlotPos[t*K+k]
			if weighted {
				w[k] = pw[row*K+k]
			}
		}
	}
}

// slotGrad is the weight gradient of slot k of token t of side when the
// slot's expert lives in domain n: the owner's GradRecvWeights (peer
// buffer 1) at the token's row, 0 if the row was dropped there (capacity
// mode); 0 for an empty slot or another domain.
func slotGrad(env *datapath.Env, lay *plan.Layout, side *plan.SendSide, t, k, n int, peers [][][]byte) float32 {
	K, D := lay.TopK, lay.RanksPerDomain
	ex, row := int(side.SlotExpert[t*K+k]), int(side.SlotRow[t*K+k])
	if ex < 0 {
		return 0
	}
	d := ex / lay.NumLocalExperts
	if d/D != n || row >= env.ValidRecv(lay, d) {
		return 0
	}
	return view.Float32s(peers[d%D][1])[row*K+k]
}
