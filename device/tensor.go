package device

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"slices"
)

// Tensor is a dense row-major array in device memory. Its memory is freed in
// stream order by Close or, if the caller forgets, once its Buffer is
// garbage collected; either way work already queued on it completes first.
// Queued work holds the Buffer and a CUDA graph counts the memory its work
// uses (Graph), so dropping or closing the tensor while they use it is
// safe.
type Tensor struct {
	buf   *Buffer
	shape []int
	// dims holds the shape of a tensor of at most 3 dimensions (goep's
	// have one or two), saving an allocation a tensor; a longer shape has
	// an array of its own.
	dims  [3]int
	dtype DType
	// cleanup frees the memory of a tensor dropped without Close; Close
	// stops it, so that a closed tensor leaves nothing for the garbage
	// collector to run (and a span's cleanups stay few: adding one walks
	// the span's list of them).
	cleanup runtime.Cleanup
}

// NewTensor allocates an uninitialised tensor on s.
func NewTensor(s Stream, dt DType, shape ...int) (*Tensor, error) {
	if !dt.Valid() {
		return nil, fmt.Errorf("device: new tensor: invalid dtype %v", dt)
	}
	n, err := elements(shape)
	if err != nil {
		return nil, fmt.Errorf("device: new tensor: %w", err)
	}
	buf, err := s.Alloc(n * dt.Size())
	if err != nil {
		return nil, err
	}
	t := tensorOf(buf, dt, shape)
	t.cleanup = runtime.AddCleanup(buf, freeByCleanup, buf.bufMem)
	return t, nil
}

// tensorOf is a tensor over buf with a copy of shape.
func tensorOf(buf *Buffer, dt DType, shape []int) *Tensor {
	t := &Tensor{buf: buf, dtype: dt}
	if len(shape) <= len(t.dims) {
		t.shape = t.dims[:len(shape):len(shape)]
		copy(t.shape, shape)
	} else {
		t.shape = append([]int(nil), shape...)
	}
	return t
}

// elements is the number of elements of a tensor of the given shape. Its
// errors (and TensorOf's) print a copy of shape, so that shape stays off
// the heap: a caller's shape then costs no allocation.
func elements(shape []int) (int, error) {
	n := 1
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension in shape %v", slices.Clone(shape))
		}
		n *= d
	}
	return n, nil
}

// TensorOf returns a tensor over b's memory (from byte 0) with the given
// dtype and shape; b must hold at least that many bytes. Closing the
// tensor frees b as Buffer.Free would (nothing, for memory goep does not
// own, such as CUDA.WrapDeviceMemory's).
func TensorOf(b *Buffer, dt DType, shape ...int) (*Tensor, error) {
	if b == nil || !dt.Valid() {
		return nil, fmt.Errorf("device: tensor of buffer: nil buffer or invalid dtype %v", dt)
	}
	n, err := elements(shape)
	if err != nil {
		return nil, fmt.Errorf("device: tensor of buffer: %w", err)
	}
	if n*dt.Size() > b.Size() {
		return nil, fmt.Errorf("device: tensor of buffer: %v%v needs %d bytes, the buffer has %d", dt, slices.Clone(shape), n*dt.Size(), b.Size())
	}
	return tensorOf(b, dt, shape), nil
}

// Shape returns the dimensions (do not modify).
func (t *Tensor) Shape() []int { return t.shape }

// DType returns the element type.
func (t *Tensor) DType() DType { return t.dtype }

// Len is the number of elements.
func (t *Tensor) Len() int {
	n := 1
	for _, d := range t.shape {
		n *= d
	}
	return n
}

// Rows is the first dimension (1 for a scalar).
func (t *Tensor) Rows() int {
	if len(t.shape) == 0 {
		return 1
	}
	return t.shape[0]
}

// RowBytes is the size of one row (everything after the first dimension).
func (t *Tensor) RowBytes() int {
	if t.Rows() == 0 {
		n := t.dtype.Size()
		for _, d := range t.shape[1:] {
			n *= d
		}
		return n
	}
	return t.Len() / t.Rows() * t.dtype.Size()
}

// Buffer returns the underlying memory. Holding it (as queued work does)
// keeps the memory allocated until t's Close; a graph whose work uses it
// keeps it until the graph's Close.
func (t *Tensor) Buffer() *Buffer { return t.buf }

// Bytes is the host view of the data (host backend only; nil elsewhere):
// the tensor's Len() x dtype bytes at the start of its buffer, which may be
// larger (TensorOf). Read it only after the work that writes it has
// completed.
func (t *Tensor) Bytes() []byte {
	h := t.buf.Host()
	if h == nil {
		return nil
	}
	n := t.nbytes()
	return h[:n:n]
}

// nbytes is the size of the tensor's data: Len() x dtype size, at most its
// buffer's.
func (t *Tensor) nbytes() int { return t.Len() * t.dtype.Size() }

// CheckGuards reports writes outside the tensor's memory (host backend).
func (t *Tensor) CheckGuards() error { return t.buf.CheckGuards() }

// Closed reports whether t's memory was freed (Close, or Free of its
// Buffer): goep refuses such a tensor as an argument.
func (t *Tensor) Closed() bool { return t != nil && t.buf.Freed() }

// Close frees the memory in stream order. Safe to call more than once.
func (t *Tensor) Close() error {
	if t != nil {
		t.buf.Free()
		t.cleanup.Stop()
		runtime.KeepAlive(t.buf) // Stop needs the buffer reachable
	}
	return nil
}

func (t *Tensor) String() string { return fmt.Sprintf("%v%v", t.dtype, t.shape) }

// Upload enqueues a copy of data into t on t's stream and waits for it.
func Upload(ctx context.Context, t *Tensor, data []byte) error {
	if t.Closed() {
		return fmt.Errorf("device: upload into %v: %w: the tensor was closed", t, ErrClosed)
	}
	if len(data) != t.nbytes() {
		return fmt.Errorf("device: upload of %d bytes into %v (%d bytes)", len(data), t, t.nbytes())
	}
	if t.buf.stream == nil {
		return fmt.Errorf("device: upload into %v: %w: memory without a stream (wrapped or a view); copy on a stream (CUDAStream.UploadBuffer)", t, ErrUnsupported)
	}
	if c, ok := t.buf.stream.(copier); ok {
		// t.buf's cleanup would free it: t stays reachable until the copy
		// is done.
		defer runtime.KeepAlive(t)
		return c.upload(ctx, t.buf, data) // into the first len(data) bytes
	}
	hs, ok := t.buf.stream.(*HostStream)
	if !ok {
		return fmt.Errorf("device: upload: %w on %s", ErrUnsupported, t.buf.stream.Backend().Kind())
	}
	hs.Go("upload", func() error {
		copy(t.Bytes(), data)
		return nil
	})
	return hs.Synchronize(ctx)
}

// Download waits for t's stream and returns a copy of t's bytes.
func Download(ctx context.Context, t *Tensor) ([]byte, error) {
	if t.Closed() {
		return nil, fmt.Errorf("device: download of %v: %w: the tensor was closed", t, ErrClosed)
	}
	if t.buf.stream == nil {
		if t.buf.region != nil {
			return append([]byte(nil), t.Bytes()...), nil // a peer's mapped host buffer
		}
		return nil, fmt.Errorf("device: download of %v: %w: memory without a stream (wrapped or a view); copy on a stream (CUDAStream.DownloadBuffer)", t, ErrUnsupported)
	}
	if c, ok := t.buf.stream.(copier); ok {
		defer runtime.KeepAlive(t) // as in Upload
		return c.download(ctx, t.buf, t.nbytes())
	}
	if err := t.buf.stream.Synchronize(ctx); err != nil {
		return nil, err
	}
	if t.buf.region == nil {
		return nil, fmt.Errorf("device: download: %w on %s", ErrUnsupported, t.buf.stream.Backend().Kind())
	}
	return append([]byte(nil), t.Bytes()...), nil
}

// copier is a stream of a backend whose memory the host cannot read
// directly (CUDA): it copies through staging memory and waits.
// upload copies data into the first len(data) bytes of b, download
// returns the first n bytes of b.
type copier interface {
	upload(ctx context.Context, b *Buffer, data []byte) error
	download(ctx context.Context, b *Buffer, n int) ([]byte, error)
}

// Encoding helpers: goep's data is little-endian, as on every GPU host.

// EncodeFloat32 converts values to dtype dt (BF16, FP32 or FP8E4M3) bytes,
// rounding to nearest even (fp8: Float32ToFP8E4M3).
func EncodeFloat32(dt DType, v []float32) []byte {
	out := make([]byte, len(v)*dt.Size())
	for i, f := range v {
		switch dt {
		case BF16:
			binary.LittleEndian.PutUint16(out[2*i:], Float32ToBF16(f))
		case FP32:
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(f))
		case FP8E4M3:
			out[i] = Float32ToFP8E4M3(f)
		}
	}
	return out
}

// DecodeFloat32 converts BF16, FP32 or FP8E4M3 bytes to float32 values.
func DecodeFloat32(dt DType, b []byte) []float32 {
	n := len(b) / dt.Size()
	out := make([]float32, n)
	for i := range out {
		out[i] = LoadFloat32(dt, b, i)
	}
	return out
}

// LoadFloat32 reads element i of a BF16, FP32 or FP8E4M3 array as float32
// (exactly).
func LoadFloat32(dt DType, b []byte, i int) float32 {
	switch dt {
	case BF16:
		return BF16ToFloat32(binary.LittleEndian.Uint16(b[2*i:]))
	case FP8E4M3:
		return FP8E4M3ToFloat32(b[i])
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
}

// StoreFloat32 writes f into element i of a BF16 or FP8E4M3 (rounding to
// nearest even) or FP32 array.
func StoreFloat32(dt DType, b []byte, i int, f float32) {
	switch dt {
	case BF16:
		binary.LittleEndian.PutUint16(b[2*i:], Float32ToBF16(f))
		return
	case FP8E4M3:
		b[i] = Float32ToFP8E4M3(f)
		return
	}
	binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
}

// EncodeInt32 returns the little-endian bytes of v.
func EncodeInt32(v []int32) []byte {
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], uint32(x))
	}
	return out
}

// DecodeInt32 parses little-endian int32s.
func DecodeInt32(b []byte) []int32 {
	out := make([]int32, len(b)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}
