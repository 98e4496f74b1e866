package view

import (
	"encoding/binary"
	"math"
	"testing"
)

func TestViews(t *testing.T) {
	b := make([]byte, 10)
	binary.LittleEndian.PutUint32(b[0:], math.Float32bits(1.5))
	binary.LittleEndian.PutUint32(b[4:], uint32(0xfffffffe)) // int32 -2
	f, i, u := Float32s(b), Int32s(b), Uint16s(b)
	if len(f) != 2 || len(i) != 2 || len(u) != 5 {
		t.Fatalf("lengths %d %d %d, want 2 2 5 (a trailing partial element left out)", len(f), len(i), len(u))
	}
	if f[0] != 1.5 || i[1] != -2 || u[0] != 0 || u[1] != 0x3fc0 {
		t.Fatalf("values %v %v %v", f[0], i[1], u[:2])
	}
	f[0] = 2 // a view shares the bytes
	if math.Float32frombits(binary.LittleEndian.Uint32(b)) != 2 {
		t.Fatal("a store through the view did not reach the bytes")
	}
	if Float32s(b[:3]) != nil || Int32s(nil) != nil || Uint16s(b[:1]) != nil {
		t.Fatal("a view of less than one element is not nil")
	}
}

func TestBytes(t *testing.T) {
	v := []int32{-2, 7}
	b := Bytes(v)
	if len(b) != 8 || binary.LittleEndian.Uint32(b) != 0xfffffffe || b[4] != 7 {
		t.Fatalf("bytes % x, want the elements' 8 bytes in order", b)
	}
	b[4] = 9 // a view shares the elements
	if v[1] != 9 {
		t.Fatal("a store through the view did not reach the elements")
	}
	if Bytes([]float32{}) != nil || len(Bytes([]uint16{1})) != 2 {
		t.Fatal("lengths of empty and one-element views")
	}
}
