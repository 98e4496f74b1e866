//go:build !amd64

package permute

import "github.com/goep/goep/device"

// useAVX2 is always false off amd64: the reference loops are the
// implementation.
var useAVX2 = false

func accumulateAVX2(dt device.DType, acc []float32, row []byte, c float32, first bool) {
	accumulateGo(dt, acc, row, c, first)
}

func storeAVX2(dt device.DType, row []byte, acc []float32) { storeGo(dt, row, acc) }

func scaleAVX2(dt device.DType, dst, src []byte, c float32) { scaleGo(dt, dst, src, c) }
