//go:build cgo

package gpulayout

import (
	"math"
	"testing"
)

// TestDimsCheck: dims out of range, or buffers past int32 offsets, are
// refused; the sizes grow with the dims as layout.h lays them out.
func TestDimsCheck(t *testing.T) {
	ok := Dims{R: 4, Me: 1, K: 8, L: 64, MaxT: 128, Pad: 1, Chunk: 32, MaxRecv: math.MaxInt32, T: 100, RowCap: 400}
	if err := ok.Check(); err != nil {
		t.Fatalf("%+v: %v", ok, err)
	}
	for name, bad := range map[string]func(*Dims){
		"me":      func(d *Dims) { d.Me = 4 },
		"R":       func(d *Dims) { d.R = 0 },
		"chunk":   func(d *Dims) { d.Chunk = 0 },
		"T":       func(d *Dims) { d.T = 129 },
		"rowCap":  func(d *Dims) { d.RowCap = -1 },
		"routing": func(d *Dims) { d.R, d.MaxT, d.K = 1024, 1<<20, 8 },
		"tables":  func(d *Dims) { d.T, d.MaxT, d.K, d.RowCap = 1<<27, 1<<27, 16, 1 },
	} {
		d := ok
		bad(&d)
		if err := d.Check(); err == nil {
			t.Errorf("%s: %+v accepted", name, d)
		}
	}
	// 4 ranks of 64 experts: fromSrc 16, expFrom 1024, rowBase 16,
	// expBase 1024, perExpert 256, segStart 256, recvCounts 4, permCounts
	// 4, colCnt (4 + 4*65) columns x 4 chunks, summary 8 + 8 + 129.
	if got, want := ok.WorkspaceInts(), 16+1024+16+1024+256+256+4+4+264*4+145; got != want {
		t.Errorf("workspace %d ints, want %d", got, want)
	}
	if got, want := ok.TableInts(), 3*100*4+100*8+2*400+2*400*8; got != want {
		t.Errorf("tables %d ints, want %d", got, want)
	}
	if off, n := ok.Summary(); n != 145 || off+n != ok.WorkspaceInts() {
		t.Errorf("summary at %d, %d ints", off, n)
	}
}
