package launcher

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePort: the port is below the kernel's ephemeral range where the
// range can be read, and rank 0 can listen on it.
func TestFreePort(t *testing.T) {
	lo, rangeErr := ephemeralLow()
	for range 20 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if rangeErr == nil && lo > 2048 && (p < lo/2 || p >= lo) {
			t.Fatalf("FreePort = %d, want a port in [%d, %d) (the ephemeral range starts at %d)", p, lo/2, lo, lo)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("listen on FreePort's %d: %v", p, err)
		}
		l.Close()
	}
}
