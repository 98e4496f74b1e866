//go:build !amd64 && !arm64

package permute

import "github.com/goep/goep/device"

// useAsm is always false off amd64 and arm64: the reference loops are the
// implementation.
var useAsm = false

func accumulateAsm(dt device.DType, acc []float32, row []byte, c float32, first bool) {
	accumulateGo(dt, acc, row, c, first)
}

func storeAsm(dt device.DType, row []byte, acc []float32) { storeGo(dt, row, acc) }

func scaleAsm(dt device.DType, dst, src []byte, c float32) { scaleGo(dt, dst, src, c) }
