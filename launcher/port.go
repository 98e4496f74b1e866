package launcher

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// FreePort returns a TCP port on 127.0.0.1 for a rendezvous whose port must
// be handed to the ranks before rank 0 listens on it (Spawn, tests under
// mpirun). It is free when FreePort returns, and it lies below the kernel's
// ephemeral port range (Linux: /proc/sys/net/ipv4/ip_local_port_range), so
// that no socket bound to port 0 and no outgoing connection can take it
// before rank 0 binds it: a port from the ephemeral range, free a moment
// ago, was once taken in between (rank 0: "bind: address already in
// use"). Where the range cannot be read, or no port below it is free, it
// falls back to a port the kernel picks (free a moment ago).
func FreePort() (int, error) {
	if lo, err := ephemeralLow(); err == nil && lo > 2048 {
		// Up to 64 random tries in [lo/2, lo): above the well-known and
		// most registered service ports, below the ephemeral ones.
		for range 64 {
			p := lo/2 + rand.IntN(lo-lo/2)
			if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p))); err == nil {
				l.Close()
				return p, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("launcher: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() (int, error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, errors.New("launcher: ip_local_port_range: want two ports")
	}
	return strconv.Atoi(f[0])
}
