package cuda

import (
	"errors"
	"fmt"
	"testing"
)

func TestErrorFormat(t *testing.T) {
	err := fmt.Errorf("cuda: alloc 8 bytes: %w", &Error{Op: "cuMemAllocAsync", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY"})
	want := "cuda: alloc 8 bytes: cuda: cuMemAllocAsync: CUDA_ERROR_OUT_OF_MEMORY (2)"
	if err.Error() != want {
		t.Errorf("got %q\nwant %q", err.Error(), want)
	}
	if !IsCode(err, CodeOutOfMemory) || IsCode(err, CodeNoDevice) || IsCode(errors.New("x"), 2) {
		t.Error("IsCode wrong")
	}
	for h, want := range map[HandleType]string{HandleNone: "none", HandlePosixFD: "posix-fd", HandleFabric: "fabric", 3: "HandleType(3)"} {
		if h.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(h), h.String(), want)
		}
	}
}
