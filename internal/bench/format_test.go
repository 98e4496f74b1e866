package bench

import (
	"bytes"
	"strings"
	"testing"
)

// TestRDMALines: with several domains the table's footer has one rdma line
// per case, with the bytes of a one-way call (dispatch-combine's halved),
// none for a case of 0 tokens, and none at all with one domain.
func TestRDMALines(t *testing.T) {
	c := Defaults()
	c.Ranks, c.RanksPerDomain = 8, 4
	rows := []Row{
		// tokens 256: dispatch-combine first, its bytes count twice.
		{Call: CallDispatchCombine, Tokens: 256, Hidden: 2048, DType: "bf16", RDMABytes: 4e6, RDMAGBps: 1, RDMACrossBytes: 2e6, RDMAFlatBytes: 5.5e6},
		{Call: CallDispatch, Tokens: 256, Hidden: 2048, DType: "bf16", RDMABytes: 2e6, RDMAGBps: 1, RDMACrossBytes: 1e6, RDMAFlatBytes: 2.75e6},
		// tokens 0: nothing to count, no line.
		{Call: CallDispatch, Tokens: 0, Hidden: 2048, DType: "bf16"},
		// every token stays in its domain.
		{Call: CallDispatch, Tokens: 4, Hidden: 16, DType: "fp32", RDMABytes: 256, RDMAGBps: 1},
	}
	want := "# rdma tokens 256 hidden 2048 bf16: 1.00 MB cross domains per rank per one-way call (each token once per remote domain; rdma_GBps counts 2.00 MB, own domain included); the flat scheme (every token to every remote rank) would send 2.75 MB, 2.75x as much\n" +
		"# rdma tokens 4 hidden 16 fp32: no token leaves its domain (rdma_GBps counts 256 B per rank per one-way call, own domain included)\n"
	if got := rdmaLines(rows); got != want {
		t.Errorf("rdmaLines:\n%s\nwant:\n%s", got, want)
	}

	var b bytes.Buffer
	if err := WriteTable(&b, Record{Config: c, Rows: rows[1:2]}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "\n# rdma tokens 256 hidden 2048 bf16: 1.00 MB cross domains") {
		t.Errorf("table has no rdma line:\n%s", b.String())
	}

	one := []Row{{Call: CallDispatch, Tokens: 256, Hidden: 2048, DType: "bf16"}}
	b.Reset()
	if err := WriteTable(&b, Record{Config: Defaults(), Rows: one}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "# rdma") {
		t.Errorf("one domain, but the table has an rdma line:\n%s", b.String())
	}
}

func TestByteSize(t *testing.T) {
	for _, tc := range []struct {
		x    float64
		want string
	}{
		{0, "0 B"}, {999, "999 B"}, {1000, "1.00 kB"}, {1.5e6, "1.50 MB"}, {2.25e9, "2.25 GB"},
	} {
		if got := byteSize(tc.x); got != tc.want {
			t.Errorf("byteSize(%v) = %q, want %q", tc.x, got, tc.want)
		}
	}
}
