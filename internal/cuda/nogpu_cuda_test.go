//go:build cuda && cgo

package cuda

import (
	"errors"
	"testing"
	"unsafe"
)

// These tests need the driver library but no GPU.

func TestResultNames(t *testing.T) {
	for _, c := range []struct {
		code int
		name string
	}{
		{CodeInvalidValue, "CUDA_ERROR_INVALID_VALUE"},
		{CodeNoDevice, "CUDA_ERROR_NO_DEVICE"},
		{CodeNotReady, "CUDA_ERROR_NOT_READY"},
		{CodeInvalidPTX, "CUDA_ERROR_INVALID_PTX"},
	} {
		err := resultOf("cuTest", c.code)
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("code %d: %v, want *Error", c.code, err)
		}
		if e.Op != "cuTest" || e.Code != c.code || e.Name != c.name {
			t.Errorf("code %d: %+v, want name %s", c.code, *e, c.name)
		}
	}
	if err := resultOf("cuTest", 0); err != nil {
		t.Errorf("CUDA_SUCCESS: %v", err)
	}
	if err := resultOf("cuTest", 987654); err == nil || !IsCode(err, 987654) {
		t.Errorf("unknown code: %v", err)
	}
}

// TestOpenWithoutGPU: on a machine without a GPU, Open returns the typed
// driver error (never exits or panics).
func TestOpenWithoutGPU(t *testing.T) {
	if n, err := NumDevices(); err == nil && n > 0 {
		t.Skipf("%d GPUs present", n)
	}
	d, err := Open(0)
	if err == nil {
		d.Close()
		t.Fatal("Open(0) succeeded without a GPU")
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("Open(0): %v, want an *Error", err)
	}
	t.Logf("Open(0): %v", err)
	if _, err := Open(-1); err == nil {
		t.Error("Open(-1): no error")
	}
}

// TestPackArgs checks the kernelParams block: each value at its own size
// and alignment, in argument order.
func TestPackArgs(t *testing.T) {
	args := []any{int32(-7), DevicePtr(0x7f0000001000), int64(1 << 40), uint32(9), float32(1.5), uint64(3)}
	params, free, err := packArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	defer free()
	ptrs := unsafe.Slice(params, len(args))
	base := uintptr(unsafe.Pointer(params))
	wantOff := []uintptr{48, 56, 64, 72, 76, 80} // 6 pointers, then the values
	for i, p := range ptrs {
		if off := uintptr(p) - base; off != wantOff[i] {
			t.Errorf("arg %d at offset %d, want %d", i, off, wantOff[i])
		}
	}
	if v := *(*int32)(ptrs[0]); v != -7 {
		t.Errorf("int32 = %d", v)
	}
	if v := *(*uint64)(ptrs[1]); v != 0x7f0000001000 {
		t.Errorf("DevicePtr = %#x", v)
	}
	if v := *(*int64)(ptrs[2]); v != 1<<40 {
		t.Errorf("int64 = %d", v)
	}
	if v := *(*uint32)(ptrs[3]); v != 9 {
		t.Errorf("uint32 = %d", v)
	}
	if v := *(*float32)(ptrs[4]); v != 1.5 {
		t.Errorf("float32 = %v", v)
	}
	if v := *(*uint64)(ptrs[5]); v != 3 {
		t.Errorf("uint64 = %d", v)
	}

	for _, bad := range []any{int(1), uintptr(1), float64(1), []byte{1}, &args} {
		if _, _, err := packArgs([]any{int32(0), bad}); err == nil {
			t.Errorf("packArgs with %T: no error", bad)
		}
	}
	if p, free, err := packArgs(nil); err != nil || p != nil {
		t.Errorf("packArgs(nil) = %v, %v", p, err)
	} else {
		free()
	}
}
